"""The update spool: streamed reduction equal to the in-memory one, hostile spilled bytes refused.

Spilled files are unnamed where the file system allows it and named elsewhere; both are re-hashed
when read back (another process of the same user can reach either); ``named_files`` forces the
second kind.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from lensemble.config.schema import RobustnessConfig
from lensemble.durable import DiskFull
from lensemble.errors import IntegrityError, PayloadError
from lensemble.federation import robustness
from lensemble.federation import spool as spool_module
from lensemble.federation import spool_reader as spool_reader_module
from lensemble.federation.diloco import canonical_mean
from lensemble.federation.payload import bytes_hash, decode, encode, manifest
from lensemble.federation.quantization import dequantize, quantize
from lensemble.federation.robustness import (
    aggregate,
    aggregate_spooled,
    decide,
    screen,
    update_norm,
)
from lensemble.federation.spool import UpdateSpool

IDS = ("alpha", "bravo", "charlie", "delta", "echo")
# One tensor longer than a block, so blocks and tensor edges both occur; a scalar too.
SHAPES = {"w": (3 * 64 + 37,), "b": (3, 5), "s": ()}
CHUNK = 10


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 64 (coordinate-wise) and 50 (mean) elements, so tiny tensors span several."""
    monkeypatch.setattr(robustness, "BLOCK", 64)
    monkeypatch.setattr(robustness, "MEAN_BLOCK", 50)


@pytest.fixture
def named_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spill to named files, as on a file system without ``O_TMPFILE`` (overlayfs)."""
    monkeypatch.setattr(spool_module, "_unnamed_file", lambda folder: None)


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def updates(n: int, seed: int = 0) -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i, pid in enumerate(IDS[:n]):
        # Different scales, so a median-based bound clips some updates.
        out[pid] = {k: torch.randn(s, generator=g) * (1 + 20 * (i == 0)) for k, s in SHAPES.items()}
    return out


def payload(delta: dict[str, torch.Tensor], scheme: str, pid: str) -> bytes:
    meta = {"participant": pid, "kind": "pseudo-gradient", "scheme": scheme}
    return encode(quantize(delta, scheme, CHUNK), meta)


def spool_of(
    folder: Path | None,
    payloads: dict[str, bytes],
    order: list[str],
    into: UpdateSpool | None = None,
) -> tuple[UpdateSpool, dict[str, float]]:
    """Judge-like norms of ``payloads`` and a spool (``into``, or a new one) holding them."""
    spool = into if into is not None else UpdateSpool(folder, memory_budget=0)
    norms = {}
    arch = manifest({k: torch.zeros(s) for k, s in SHAPES.items()})
    for pid in order:  # arrival order
        data = payloads[pid]
        decoded = decode(data, copy=False)
        scheme = decoded.metadata.get("scheme", "")
        norms[pid] = update_norm(dequantize(decoded.tensors, arch, scheme, CHUNK))
        spool.add(pid, data, bytes_hash(data), decoded)
    return spool, norms


def assert_reduces_as_in_memory(
    spool: UpdateSpool, payloads: dict[str, bytes], norms: dict[str, float], scheme: str
) -> None:
    """The mean over ``spool`` is bit for bit the mean over ``payloads`` held in memory."""
    config = RobustnessConfig()
    in_memory, _ = spool_of(None, payloads, sorted(payloads))
    screening = decide(norms, config)
    a = aggregate_spooled(spool, screening, SHAPES, config, scheme=scheme, chunk=CHUNK)
    b = aggregate_spooled(in_memory, screening, SHAPES, config, scheme=scheme, chunk=CHUNK)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("scheme", ["none", "fp16", "bf16", "int8"])
@pytest.mark.parametrize("aggregator", ["mean", "trimmed_mean", "median"])
@pytest.mark.parametrize("mode", ["clip", "reject"])
@pytest.mark.parametrize("files", ["unnamed", "named"])
def test_streamed_reduction_is_bit_identical_to_the_in_memory_one_in_any_arrival_order(
    tmp_path: Path, scheme: str, aggregator: str, mode: str, files: str, request: Any
) -> None:
    if files == "named":
        request.getfixturevalue("named_files")
    config = RobustnessConfig(aggregator=aggregator, norm_bound_mode=mode, median_factor=2.0)
    deltas = updates(4)
    payloads = {pid: payload(d, scheme, pid) for pid, d in deltas.items()}
    arch = manifest({k: torch.zeros(s) for k, s in SHAPES.items()})
    wire = {pid: dequantize(decode(p).tensors, arch, scheme, CHUNK) for pid, p in payloads.items()}
    expected_screen = screen(wire, config)
    assert expected_screen.clipped or expected_screen.rejected  # the bound really acts
    expected = aggregate(expected_screen.kept, config)
    for n, order in enumerate(itertools.islice(itertools.permutations(sorted(payloads)), 0, 24, 7)):
        spool, norms = spool_of(tmp_path / str(n), payloads, list(order))
        screening = decide(norms, config)
        assert screening.to_record() == expected_screen.to_record()
        got = aggregate_spooled(spool, screening, SHAPES, config, scheme=scheme, chunk=CHUNK)
        assert set(got) == set(expected)
        for name in expected:
            assert got[name].shape == expected[name].shape
            assert torch.equal(got[name], expected[name]), (name, order)


def test_without_a_folder_the_payloads_stay_in_memory_and_give_the_same_result(
    tmp_path: Path, named_files: None
) -> None:
    config = RobustnessConfig()
    payloads = {pid: payload(d, "none", pid) for pid, d in updates(3).items()}
    on_disk, norms = spool_of(tmp_path, payloads, sorted(payloads))
    in_memory, _ = spool_of(None, payloads, sorted(payloads))
    assert len(list(tmp_path.iterdir())) == 3
    screening = decide(norms, config)
    a = aggregate_spooled(on_disk, screening, SHAPES, config, scheme="none", chunk=CHUNK)
    b = aggregate_spooled(in_memory, screening, SHAPES, config, scheme="none", chunk=CHUNK)
    assert all(torch.equal(a[k], b[k]) for k in a)
    on_disk.reset()
    assert list(tmp_path.iterdir()) == []


def test_unnamed_spilled_files_leave_no_name_and_are_reused_then_closed() -> None:
    # tmpfs always supports O_TMPFILE, so this runs on any Linux machine (the CI's /tmp may be
    # overlayfs, which does not).
    config = RobustnessConfig()
    first = {pid: payload(d, "none", pid) for pid, d in updates(3).items()}
    # The next attempt's payloads are shorter (other metadata): a reused file is cut to size.
    second = {pid: payload(d, "fp16", pid) for pid, d in updates(3, seed=1).items()}
    assert all(len(second[pid]) < len(first[pid]) for pid in first)
    folder = Path("/dev/shm") / f"lensemble-spool-test-{os.getpid()}"
    before = open_descriptors()
    try:
        spool, norms = spool_of(folder, first, sorted(first))
        assert folder.is_dir() and list(folder.iterdir()) == []  # no path leads to an update
        assert open_descriptors() == before + 3
        in_memory, _ = spool_of(None, first, sorted(first))
        screening = decide(norms, config)
        for _ in range(2):  # each reader has its own position: read back twice, same result
            a = aggregate_spooled(spool, screening, SHAPES, config, scheme="none", chunk=CHUNK)
            b = aggregate_spooled(in_memory, screening, SHAPES, config, scheme="none", chunk=CHUNK)
            assert all(torch.equal(a[k], b[k]) for k in a)
        assert open_descriptors() == before + 3  # readers do not close the spool's files
        spool.reset()  # the next attempt: the same three files, overwritten
        assert open_descriptors() == before + 3
        _, norms = spool_of(folder, second, sorted(second), into=spool)
        assert open_descriptors() == before + 3
        assert_reduces_as_in_memory(spool, second, norms, "fp16")
        spool.close()
        assert open_descriptors() == before
    finally:
        for leftover in folder.glob("*"):
            leftover.unlink()
        folder.rmdir()


def test_a_kept_file_that_cannot_grow_is_closed_and_the_update_held_in_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    small = {pid: payload(d, "fp16", pid) for pid, d in updates(2).items()}
    large = {pid: payload(d, "none", pid) for pid, d in updates(2, seed=1).items()}
    folder = Path("/dev/shm") / f"lensemble-spool-grow-{os.getpid()}"
    before = open_descriptors()
    try:
        spool, _ = spool_of(folder, small, sorted(small))
        spool.reset()
        assert open_descriptors() == before + 2  # kept for the next attempt
        needed: list[int] = []

        def no_room(where: Path, n: int) -> None:
            needed.append(n)
            raise DiskFull(f"{where} has no room for {n} bytes")

        monkeypatch.setattr(spool_module, "check_free_space", no_room)
        _, norms = spool_of(folder, large, sorted(large), into=spool)
        # Only the growth was asked for, and each refused file was closed, not leaked.
        assert needed == [len(large[pid]) - len(small[pid]) for pid in sorted(large)]
        assert open_descriptors() == before
        assert_reduces_as_in_memory(spool, large, norms, "none")
        spool.close()
    finally:
        for leftover in folder.glob("*"):
            leftover.unlink()
        folder.rmdir()


def _one_spilled(tmp_path: Path) -> tuple[UpdateSpool, dict[str, float], Path]:
    payloads = {pid: payload(d, "none", pid) for pid, d in updates(3).items()}
    spool, norms = spool_of(tmp_path, payloads, sorted(payloads))
    files = sorted(tmp_path.glob("update-*.safetensors"))
    assert [f.read_bytes() for f in files] == [payloads[pid] for pid in sorted(payloads)]
    return spool, norms, files[1]


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: b[: len(b) // 2], id="truncated"),
        pytest.param(lambda b: b[:-1], id="one-byte-short"),
        pytest.param(lambda b: b + b"\0", id="extended"),
        pytest.param(lambda b: b[:-5] + bytes([b[-5] ^ 1]) + b[-4:], id="one-bit-in-the-data"),
        pytest.param(lambda b: b[:20] + bytes([b[20] ^ 1]) + b[21:], id="one-bit-in-the-header"),
    ],
)
@pytest.mark.parametrize("aggregator", ["mean", "median"])
def test_a_spilled_update_changed_after_acceptance_fails_closed(
    tmp_path: Path, damage: object, aggregator: str, named_files: None
) -> None:
    spool, norms, victim = _one_spilled(tmp_path)
    victim.write_bytes(damage(victim.read_bytes()))  # type: ignore[operator]
    config = RobustnessConfig(aggregator=aggregator)
    with pytest.raises(IntegrityError, match="bravo.*changed after it was accepted"):
        aggregate_spooled(spool, decide(norms, config), SHAPES, config, scheme="none", chunk=CHUNK)


def test_a_deleted_spilled_update_fails_closed(tmp_path: Path, named_files: None) -> None:
    spool, norms, victim = _one_spilled(tmp_path)
    victim.unlink()
    config = RobustnessConfig()
    with pytest.raises(IntegrityError, match="cannot be read"):
        aggregate_spooled(spool, decide(norms, config), SHAPES, config, scheme="none", chunk=CHUNK)


def test_reset_removes_leftovers_of_an_earlier_process(tmp_path: Path) -> None:
    (tmp_path / "update-0007.safetensors").write_bytes(b"left by a crash")
    UpdateSpool(tmp_path, memory_budget=0).reset()
    assert list(tmp_path.iterdir()) == []


def test_decode_without_copy_shares_the_buffer_and_with_copy_does_not() -> None:
    data = bytearray(encode({"w": torch.arange(4.0), "i": torch.arange(3)}, {}))
    shared = decode(data, copy=False).tensors["w"]
    own = decode(data).tensors["w"]
    data[-4 * 4 :] = torch.full((4,), 7.0).numpy().tobytes()  # "w" is the last F32 tensor
    assert torch.equal(shared, torch.full((4,), 7.0))
    assert torch.equal(own, torch.arange(4.0))


@pytest.mark.parametrize(
    ("offsets", "message"),
    [([0, 8], "spans 8 bytes"), ([4, 20], "starts at byte 4"), ([0, 16], None)],
)
def test_decode_applies_safetensors_layout_rules(offsets: list[int], message: str | None) -> None:
    header = json.dumps(
        {
            "__metadata__": {"format": "lensemble-payload-v1"},
            "w": {"dtype": "F32", "shape": [4], "data_offsets": offsets},
        }
    ).encode()
    header += b" " * (-len(header) % 8)
    data = struct.pack("<Q", len(header)) + header + bytes(16)
    if message is None:
        assert torch.equal(decode(data).tensors["w"], torch.zeros(4))
    else:
        with pytest.raises(PayloadError, match=message):
            decode(data)


def test_the_mean_starts_from_positive_zero_as_a_sum_from_zeros_does() -> None:
    d = {"a": {"w": torch.tensor([-0.0, -0.0, 1.0])}, "b": {"w": torch.tensor([-0.0, 0.0, -1.0])}}
    got = canonical_mean(d)["w"]
    want = (torch.zeros(3) + d["a"]["w"] + d["b"]["w"]) / 2
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert got.view(torch.int32)[0].item() == 0  # +0.0, not -0.0


@pytest.mark.parametrize("scheme", ["none", "int8"])
@pytest.mark.parametrize("block", [7, 1024, 5000])
def test_an_unnamed_file_read_back_gives_the_same_blocks(block: int, scheme: str) -> None:
    """Blocks of a few elements, of a page, and ones that end mid-tensor."""
    g = torch.Generator().manual_seed(3)
    payloads = {
        pid: payload({"w": torch.randn(20_000, generator=g), "b": torch.randn(3, 5)}, scheme, pid)
        for pid in IDS[:2]
    }
    # tmpfs makes unnamed files on any Linux machine (the CI's /tmp may be overlayfs).
    mapped = UpdateSpool(Path("/dev/shm") / f"lensemble-spool-test-{os.getpid()}", memory_budget=0)
    held = UpdateSpool(None)
    for pid, data in payloads.items():
        for spool in (mapped, held):
            spool.add(pid, data, bytes_hash(data), decode(data, copy=False))
    assert all(entry.fd is not None for entry in mapped._entries.values())  # unnamed
    assert all(len(p) > 6 * 4096 for p in payloads.values())
    for pid in payloads:
        a = mapped.reader(pid, scheme=scheme, chunk=CHUNK, block=block)
        b = held.reader(pid, scheme=scheme, chunk=CHUNK, block=block)
        compared = 0
        for x, y in zip(a.blocks(), b.blocks(), strict=True):  # a block is valid until the next
            assert x[:2] == y[:2] and torch.equal(x[2], y[2])
            compared += 1
        assert compared
        a.finish()
        b.finish()
    mapped.close()
    assert mapped.folder is not None
    mapped.folder.rmdir()  # empty: no path ever led to an update


def test_an_unnamed_file_whose_length_changed_fails_closed_before_it_is_read() -> None:
    """A file shorter than the payload is refused before any block is read."""
    payloads = {pid: payload(d, "none", pid) for pid, d in updates(2).items()}
    folder = Path("/dev/shm") / f"lensemble-spool-test-{os.getpid()}"
    spool, _ = spool_of(folder, payloads, sorted(payloads))
    victim = sorted(payloads)[0]
    fd = spool._entries[victim].fd
    assert fd is not None
    os.ftruncate(fd, len(payloads[victim]) - 4)
    with pytest.raises(IntegrityError, match="bytes long"):
        spool.reader(victim, scheme="none", chunk=CHUNK, block=50)
    spool.close()
    folder.rmdir()


# ------------------------------------------------------------------ streams landed in the spool
def landed_spool_of(
    spool: UpdateSpool, payloads: dict[str, bytes], piece: int = 100
) -> dict[str, float]:
    """Land each payload in pieces (as a transport receives it), judge the view, keep it."""
    norms = {}
    arch = manifest({k: torch.zeros(s) for k, s in SHAPES.items()})
    for pid in sorted(payloads):
        data = payloads[pid]
        landing = spool.land(len(data))
        assert landing is not None
        for start in range(0, len(data), piece):
            landing.write(data[start : start + piece])
        view = landing.finish()
        assert view.readonly and view == data
        decoded = decode(view, copy=False)
        norms[pid] = update_norm(dequantize(decoded.tensors, arch, "none", CHUNK))
        spool.add(pid, view, bytes_hash(data), decoded, landing)
        del view, decoded, landing
    return norms


def shm_folder(name: str) -> Path:
    # tmpfs always makes unnamed files (the CI's /tmp may be overlayfs, which does not).
    return Path("/dev/shm") / f"lensemble-{name}-{os.getpid()}"


def spills_counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the payloads written to spool files from now on (a list that grows)."""
    spilled: list[int] = []
    real_spill = UpdateSpool._spill
    monkeypatch.setattr(
        UpdateSpool,
        "_spill",
        lambda self, view: spilled.append(len(view)) or real_spill(self, view),
    )
    return spilled


def test_a_landed_stream_becomes_its_spool_entry_without_a_second_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    payloads = {pid: payload(d, "none", pid) for pid, d in updates(3).items()}
    folder = shm_folder("land")
    spilled = spills_counted(monkeypatch)
    before = open_descriptors()
    try:
        spool = UpdateSpool(folder, memory_budget=0)
        norms = landed_spool_of(spool, payloads)
        assert spilled == []  # adopted as landed, never written again
        assert open_descriptors() == before + 3 and list(folder.iterdir()) == []
        assert_reduces_as_in_memory(spool, payloads, norms, "none")
        spool.reset()  # the next attempt lands in the same files
        landed_spool_of(spool, payloads)
        assert open_descriptors() == before + 3
        spool.close()
        assert open_descriptors() == before
    finally:
        folder.rmdir()


def test_a_landing_nobody_keeps_goes_back_once_its_last_view_is_gone() -> None:
    data = payload(updates(1)["alpha"], "none", "alpha")
    folder = shm_folder("refused")
    before = open_descriptors()
    try:
        spool = UpdateSpool(folder, memory_budget=0)
        truncated = spool.land(len(data))  # a stream that broke off half way
        assert truncated is not None
        truncated.write(data[:10])
        del truncated
        assert open_descriptors() == before + 1 and len(spool._free) == 1
        refused = spool.land(len(data))  # reuses that file
        assert refused is not None and len(spool._free) == 0
        refused.write(data)
        view = refused.finish()
        del refused
        # The refused update's view is still held (a judge reading it): its file stays out.
        assert len(spool._free) == 0
        assert bytes(view) == data
        del view
        assert len(spool._free) == 1 and open_descriptors() == before + 1
        spool.close()
        assert open_descriptors() == before
        late = UpdateSpool(folder, memory_budget=0)
        landing = late.land(len(data))
        late.close()  # a stream still landing when the spool closed closes its own file
        del landing
        assert open_descriptors() == before
    finally:
        folder.rmdir()


def test_small_updates_are_held_in_memory_within_the_budget_and_the_rest_spill(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Within the budget nothing is written or hashed again; past it, updates spill as before."""
    payloads = {pid: payload(d, "none", pid) for pid, d in updates(4).items()}
    size = len(payloads["alpha"])
    assert all(len(p) == size for p in payloads.values())
    spilled = spills_counted(monkeypatch)
    folder = shm_folder("held")
    before = open_descriptors()
    try:
        spool = UpdateSpool(folder, memory_budget=2 * size)  # room for two of the four
        assert spool.land(size) is None  # a stream that fits is received in memory
        order = sorted(payloads)
        _, norms = spool_of(None, payloads, order, into=spool)
        assert spilled == [size, size]  # the third and fourth, in arrival order
        assert open_descriptors() == before + 2
        hashes: list[int] = []
        real_sha256 = spool_reader_module.hashlib.sha256
        monkeypatch.setattr(
            spool_reader_module.hashlib,
            "sha256",
            lambda *a: hashes.append(1) or real_sha256(*a),
        )
        assert_reduces_as_in_memory(spool, payloads, norms, "none")
        held_two = len(hashes)
        hashes.clear()
        all_files, _ = spool_of(None, payloads, order, into=UpdateSpool(folder, memory_budget=0))
        assert_reduces_as_in_memory(all_files, payloads, norms, "none")
        all_files.close()
        monkeypatch.setattr(spool_reader_module.hashlib, "sha256", real_sha256)
        # Only the two files are hashed again on use, not the two payloads held in memory.
        assert held_two > 0 and held_two * 4 == len(hashes) * 2
        assert spool.land(size) is not None  # the budget is full: a new stream lands
        spool.reset()  # the budget is free again for the next attempt
        assert spool.land(size) is None
        monkeypatch.setattr(spool_module, "MEMORY_PAYLOAD_BYTES", size - 1)
        assert spool.land(size) is not None  # larger than any held payload: a file
        spool.close()
        assert open_descriptors() == before
    finally:
        folder.rmdir()


def test_no_folder_no_room_or_no_unnamed_files_land_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert UpdateSpool(None).land(1000) is None
    monkeypatch.setattr(spool_module, "_unnamed_file", lambda folder: None)
    assert (
        UpdateSpool(tmp_path / "named", memory_budget=0).land(1000) is None
    )  # would be a named file: memory
    monkeypatch.undo()

    def no_room(where: Path, n: int) -> None:
        raise DiskFull(f"{where} has no room for {n} bytes")

    monkeypatch.setattr(spool_module, "check_free_space", no_room)
    with caplog.at_level("WARNING", logger="lensemble.federation.spool"):
        assert UpdateSpool(shm_folder("full"), memory_budget=0).land(1000) is None
    assert "holding it in memory" in caplog.text and "no room for 1000 bytes" in caplog.text
    shm_folder("full").rmdir()


# --------------------------------------------- rewritten by another process of the same user
def _rewrite_through_proc(fd: int, offset: int, byte: bytes) -> None:
    """Another process of this user writes ``byte`` at ``offset`` of our descriptor ``fd``.

    ``/proc/<pid>/fd/<fd>`` leads to an unnamed file too; opening it needs only the rights
    to read this process's state (same user), not to write its memory.
    """
    import subprocess
    import sys

    code = (
        "import os, sys; pid, fd, at, value = sys.argv[1:]; "
        "f = os.open(f'/proc/{pid}/fd/{fd}', os.O_WRONLY); "
        "os.pwrite(f, bytes.fromhex(value), int(at)); os.close(f)"
    )
    args = [sys.executable, "-c", code, str(os.getpid()), str(fd), str(offset), byte.hex()]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if "PermissionError" in done.stderr:  # a hardened kernel (Yama ptrace_scope 2 or 3)
        pytest.skip("this kernel keeps /proc/<pid>/fd from other processes of the same user")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("where", ["data", "header"])
@pytest.mark.parametrize("aggregator", ["mean", "median"])
def test_an_unnamed_spilled_update_rewritten_by_another_process_fails_closed(
    where: str, aggregator: str
) -> None:
    payloads = {pid: payload(d, "none", pid) for pid, d in updates(3).items()}
    folder = shm_folder("rewritten")
    try:
        spool, norms = spool_of(folder, payloads, sorted(payloads))
        victim = sorted(payloads)[1]
        entry = spool._entries[victim]
        assert entry.fd is not None and entry.path is None  # unnamed
        at = len(payloads[victim]) - 3 if where == "data" else 20
        _rewrite_through_proc(entry.fd, at, bytes([payloads[victim][at] ^ 0x40]))
        config = RobustnessConfig(aggregator=aggregator)
        with pytest.raises(IntegrityError, match=f"{victim}.*changed after it was accepted"):
            aggregate_spooled(
                spool, decide(norms, config), SHAPES, config, scheme="none", chunk=CHUNK
            )
        spool.close()
    finally:
        folder.rmdir()


def test_a_landed_stream_rewritten_before_it_is_judged_is_not_accepted() -> None:
    """The stream was hashed as it arrived; its file changed before the coordinator judged it:
    the judge sees exactly the bytes received, or nothing."""
    from lensemble.federation.messages import Reason, Submission
    from tests.support.federation import build, small_config

    folder = shm_folder("judged")
    try:
        coordinator, _, participants = build(small_config(rounds=1))
        coordinator.admission.spool = UpdateSpool(folder, memory_budget=0)
        from lensemble.federation.messages import RoundOpening

        opening = RoundOpening(0, 0, 0, coordinator.model_hash, 30.0)
        coordinator.admission.open(opening)
        good = participants["alpha"].contribute(opening, coordinator.model_payload())
        landing = coordinator.admission.spool.land(len(good.payload))
        assert landing is not None
        landing.write(good.payload)
        view = landing.finish()
        # Another process rewrites one value of the landed file (say, to hide a huge update).
        at = len(good.payload) - 2
        _rewrite_through_proc(landing._fd, at, bytes([good.payload[at] ^ 0x40]))
        assert bytes(view) != good.payload
        sub = Submission("alpha", 0, view, good.payload_hash, 0, hash_checked=True, landed=landing)
        del view, landing
        verdict = coordinator.accept(sub)
        assert verdict.reason == Reason.HASH_MISMATCH
        assert "alpha" not in coordinator.admission.spool
        coordinator.admission.spool.close()
    finally:
        folder.rmdir()


def test_spilled_files_are_0600_in_a_0700_folder(tmp_path: Path, named_files: None) -> None:
    folder = tmp_path / "spool"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)  # left by someone else with a wider mode
    payloads = {pid: payload(d, "none", pid) for pid, d in updates(2).items()}
    old = os.umask(0o022)
    try:
        spool_of(folder, payloads, sorted(payloads))
    finally:
        os.umask(old)
    assert folder.stat().st_mode & 0o777 == 0o700
    files = sorted(folder.glob("update-*.safetensors"))
    assert files and all(f.stat().st_mode & 0o777 == 0o600 for f in files)
