"""Crash consistency, a full disk, and one run per folder."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import threading
from collections import namedtuple
from pathlib import Path

import pytest

from lensemble import durable
from lensemble.durable import DiskError, DiskFull, SimulatedCrash, append_line, atomic_write
from lensemble.federation.checkpoint import CheckpointStore
from lensemble.federation.ledger import Ledger, committed_chain
from lensemble.federation.verify import verify_run
from lensemble.run_lock import FolderLocked, RunLock, coordinator_lock
from tests.support.federation import build, small_config

Usage = namedtuple("Usage", "total used free")


def _fail_writes(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    def refuse(fd: int, data: object) -> int:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(durable.os, "write", refuse)


@pytest.mark.parametrize(("code", "error"), [(errno.ENOSPC, DiskFull), (errno.EIO, DiskError)])
def test_a_failed_write_is_one_sentence_and_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, error: type
) -> None:
    target = tmp_path / "model.bin"
    target.write_bytes(b"old")
    _fail_writes(monkeypatch, code)
    with pytest.raises(error) as caught:
        atomic_write(target, b"x" * 4_400_000)
    assert str(tmp_path) in caught.value.message and "4.4 MB" in caught.value.message
    assert "\n" not in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.bin"]
    assert target.read_bytes() == b"old"
    with pytest.raises(error):
        append_line(target, "a line")
    assert target.read_bytes() == b"old"  # no torn line either


def test_a_checkpoint_is_not_started_on_a_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    coordinator, transport, _ = build(small_config(rounds=2), output_dir=tmp_path)
    coordinator.run_round(transport)
    monkeypatch.setattr(durable.shutil, "disk_usage", lambda p: Usage(10**7, 10**7, 1000))
    with pytest.raises(DiskFull, match=rf"no space left in {tmp_path}/\S+: 1.0 kB free, needs"):
        coordinator.run_round(transport)
    assert CheckpointStore(tmp_path).versions() == [0, 1]
    assert not [p for p in CheckpointStore(tmp_path).folder.iterdir() if ".tmp-" in p.name]


def test_a_restart_on_a_full_disk_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    coordinator, transport, _ = build(small_config(rounds=3), output_dir=tmp_path)
    coordinator.run_round(transport)
    coordinator.run_round(transport)
    text = (tmp_path / "ledger.jsonl").read_text()
    (tmp_path / "ledger.jsonl").write_text(text[:-30])  # torn: the resume must rewrite it
    monkeypatch.setattr(durable.shutil, "disk_usage", lambda p: Usage(10**7, 10**7, 1000))
    with pytest.raises(DiskFull, match=str(tmp_path)):
        build(small_config(rounds=3), output_dir=tmp_path, resume=True)
    assert (tmp_path / "ledger.jsonl").read_text() == text[:-30]
    monkeypatch.undo()  # space freed: the resume repairs and continues
    resumed, transport2, _ = build(small_config(rounds=3), output_dir=tmp_path, resume=True)
    resumed.run(transport2)
    assert verify_run(tmp_path).ok


def _write_points(tmp_path: Path) -> list[str]:
    seen: list[str] = []
    durable.set_crash_hook(seen.append)
    try:
        coordinator, transport, _ = build(small_config(rounds=3), output_dir=tmp_path / "probe")
        coordinator.run(transport)
    finally:
        durable.set_crash_hook(None)
    return seen


@pytest.mark.integration  # about 40 s: one run and one resume per write point
def test_a_crash_at_every_write_point_resumes_to_the_same_final_hash(tmp_path: Path) -> None:
    straight = tmp_path / "straight"
    coordinator, transport, _ = build(small_config(rounds=3), output_dir=straight)
    reference = coordinator.run(transport).model_hash
    points = _write_points(tmp_path)
    assert len(points) > 20 and any("before-rename" in p for p in points)
    for index, _label in enumerate(points):
        out = tmp_path / f"crash-{index}"
        count = [0]

        def crash_at(label: str, index: int = index, count: list[int] = count) -> None:
            if count[0] == index:
                raise SimulatedCrash(label)
            count[0] += 1

        durable.set_crash_hook(crash_at)
        try:
            with pytest.raises(SimulatedCrash):
                coordinator, transport, _ = build(small_config(rounds=3), output_dir=out)
                coordinator.run(transport)
        finally:
            durable.set_crash_hook(None)
        resumed, transport2, _ = build(small_config(rounds=3), output_dir=out, resume=True)
        assert resumed.run(transport2).model_hash == reference, _label
        assert committed_chain(Ledger(out / "ledger.jsonl").records())[-1] == reference
        assert verify_run(out).ok, _label
        shutil.rmtree(out)


def test_a_crash_while_a_commit_is_written_behind_redoes_that_round_exactly(
    tmp_path: Path,
) -> None:
    """Round 1's checkpoint dies after every participant trained round 2 on its model.

    The coordinator opens round 2 while round 1's commit is still being written; the crash
    leaves round 1 uncommitted, so the resume redoes it, and each participant must rewind to
    its snapshot of round 0, two rounds behind what it last trained.
    """
    straight, transport, _ = build(small_config(rounds=3), output_dir=tmp_path / "straight")
    reference = straight.run(transport).model_hash
    out = tmp_path / "run"
    trained_round_2: set[str] = set()
    everyone = threading.Event()

    def crash_at(label: str) -> None:
        if "inner-r000002" in label and label.startswith("before-rename"):
            trained_round_2.add(label)
            if len(trained_round_2) == 4:
                everyone.set()
        if label.startswith("before-rename") and "model-v000002" in label:
            assert everyone.wait(30), "round 2 did not open while round 1 was being written"
            raise SimulatedCrash(label)

    durable.set_crash_hook(crash_at)
    try:
        coordinator, transport, _ = build(small_config(rounds=3), output_dir=out)
        with pytest.raises(SimulatedCrash):
            coordinator.run(transport)
    finally:
        durable.set_crash_hook(None)
    assert [r.round for r in Ledger(out / "ledger.jsonl").records()] == [0]
    resumed, transport2, _ = build(small_config(rounds=3), output_dir=out, resume=True)
    assert resumed.version == 1
    assert resumed.run(transport2).model_hash == reference
    assert verify_run(out).ok


def test_a_second_run_on_the_folder_fails_at_once_naming_the_holder(tmp_path: Path) -> None:
    with coordinator_lock(tmp_path), pytest.raises(FolderLocked, match=rf"pid {os.getpid()}"):
        RunLock(tmp_path / "coordinator" / "lock", "x").acquire()
    RunLock(tmp_path / "coordinator" / "lock", "x").acquire().release()  # released


def test_simulate_on_a_folder_in_use_exits_2_naming_the_pid(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, pathlib; from lensemble.run_lock import run_folder_lock;"
            "lock = run_folder_lock(pathlib.Path(sys.argv[1])).acquire();"
            "print('held', flush=True); sys.stdin.read()",
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        from tests.support.cli import run_cli

        result = run_cli("simulate", "-r", "1", "-o", str(tmp_path))
        assert result.code == 2
        assert f"pid {holder.pid}" in result.err and "in use by another run" in result.err
        assert not (tmp_path / "ledger.jsonl").exists()
    finally:
        holder.communicate("")


_ON_TINY_TMPFS = r"""
import os, subprocess, sys
from pathlib import Path
from lensemble.durable import DiskFull, append_line, atomic_write
mount = Path(sys.argv[1])
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
run = mount / "run"
atomic_write(run / "ledger.jsonl", b"{}\n")
try:
    atomic_write(run / "model-v000002.safetensors", b"x" * 4_400_000)
except DiskFull as exc:
    print("FULL", exc.message)
print("LEFT", sorted(p.name for p in run.iterdir()))
(run / "filler").write_bytes(b"f" * (2 * 2**20 - 64 * 1024))
try:
    for _ in range(10_000):
        append_line(run / "ledger.jsonl", "x" * 200)
except DiskFull as exc:
    print("FULL", exc.message)
lines = (run / "ledger.jsonl").read_text().splitlines()
print("TORN", any(len(line) not in (2, 200) for line in lines))
"""


def test_a_real_full_filesystem_leaves_no_temporary_file_and_no_torn_line(tmp_path: Path) -> None:
    """On a 2 MiB tmpfs in a user namespace (skips where unprivileged namespaces are off)."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    probe = subprocess.run(["unshare", "-Urm", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip("unprivileged user and mount namespaces are not available here")
    (tmp_path / "mnt").mkdir()
    result = subprocess.run(
        ["unshare", "-Urm", sys.executable, "-c", _ON_TINY_TMPFS, str(tmp_path / "mnt")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    assert out[0].startswith("FULL no space left in ") and "needs 4.4 MB" in out[0]
    assert out[1] == "LEFT ['ledger.jsonl']"
    assert out[2].startswith("FULL no space left in ")
    assert out[3] == "TORN False"
