"""Payload encoding: safetensors-compatible, deterministic, parsed without unpickling."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from lensemble.errors import ArchitectureMismatch, PayloadError
from lensemble.federation.payload import (
    PAYLOAD_FORMAT,
    check_architecture,
    decode,
    encode,
    encode_parts,
    manifest,
    model_hash,
    tensor_digest,
)

MIXED = {
    "b": torch.arange(6, dtype=torch.float32).reshape(2, 3),
    "a": torch.tensor([1, -2, 3], dtype=torch.int8),
    "c": torch.ones(1, dtype=torch.float64),
    "d": torch.ones(2, dtype=torch.bfloat16),
    "e": torch.ones(2, dtype=torch.float16),
    "f": torch.arange(3, dtype=torch.int64),
    "g": torch.arange(3, dtype=torch.int32),
    "empty": torch.zeros(0),
    "scalar": torch.tensor(3.0),
    "u": torch.ones(2, dtype=torch.uint8),
}


def test_layout_is_byte_identical_to_safetensors() -> None:
    assert encode(MIXED, {}) == st_save(MIXED, metadata={"format": PAYLOAD_FORMAT})


def test_any_metadata_round_trips_through_safetensors_and_is_deterministic() -> None:
    meta = {"participant": "alpha", "round": "3", "kind": "pseudo-gradient", "ü": "é"}
    data = encode(MIXED, meta)
    parsed = st_load(data)
    assert all(torch.equal(parsed[k], MIXED[k]) for k in MIXED)
    decoded = decode(data)
    assert decoded.metadata == {"format": PAYLOAD_FORMAT, **meta}
    assert encode(dict(reversed(MIXED.items())), dict(reversed(meta.items()))) == data


@pytest.mark.integration  # three child interpreters that import torch
@pytest.mark.slow
def test_bytes_are_the_same_in_another_process() -> None:
    code = (
        "import sys, torch; from lensemble.federation.payload import encode; "
        "sys.stdout.buffer.write(encode({'w': torch.arange(4.0)}, "
        "{'z': '1', 'a': '2', 'm': '3', 'k': '4'}))"
    )
    # The children run side by side: each is a separate process all the same.
    children = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) for _ in range(3)
    ]
    outs = {child.communicate()[0] for child in children}
    assert [child.returncode for child in children] == [0, 0, 0]
    assert outs == {encode({"w": torch.arange(4.0)}, {"z": "1", "a": "2", "m": "3", "k": "4"})}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "truncated"),
        (b"\x00" * 7, "truncated"),
        (struct.pack("<Q", 10**12) + b"{}", "header declares"),
        (struct.pack("<Q", 2) + b"{]", "not valid JSON"),
        (struct.pack("<Q", 2) + b"{}", "payload format"),
        (encode({"w": torch.ones(4)}, {})[:-3], "not valid safetensors"),
    ],
)
def test_malformed_payloads_are_payload_errors(data: bytes, message: str) -> None:
    with pytest.raises(PayloadError, match=message):
        decode(data)


def test_pickles_are_never_loaded(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pickle

    class Boom:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (open, (str(tmp_path / "pwned"), "w"))

    with pytest.raises(PayloadError):
        decode(pickle.dumps(Boom()))
    assert not (tmp_path / "pwned").exists()


def test_model_hash_binds_tensors_version_and_parent() -> None:
    params = {"w": torch.arange(4.0), "b": torch.zeros(2)}
    base = model_hash(params, 1, "sha256:parent")
    assert base.startswith("sha256:") and len(base) == 71
    assert model_hash(dict(reversed(params.items())), 1, "sha256:parent") == base
    assert model_hash(params, 2, "sha256:parent") != base
    assert model_hash(params, 1, "sha256:other") != base
    changed = {"w": torch.arange(4.0), "b": torch.tensor([0.0, 1e-30])}
    assert model_hash(changed, 1, "sha256:parent") != base
    # dtype and shape are part of the digest, not only the bytes
    assert tensor_digest({"w": torch.zeros(4)}) != tensor_digest({"w": torch.zeros(2, 2)})
    assert tensor_digest({"w": torch.zeros(2, dtype=torch.float16)}) != tensor_digest(
        {"w": torch.zeros(1, dtype=torch.float32)}
    )


def test_architecture_check_quotes_the_first_differing_tensor() -> None:
    arch = manifest({"a": torch.zeros(2), "b": torch.zeros(3)})
    check_architecture({"a": torch.ones(2), "b": torch.ones(3)}, arch, what="x")
    with pytest.raises(ArchitectureMismatch, match="'b' is F32\\[4\\].*F32\\[3\\]"):
        check_architecture({"a": torch.ones(2), "b": torch.ones(4)}, arch, what="x")
    with pytest.raises(ArchitectureMismatch, match="lacks tensor 'b'"):
        check_architecture({"a": torch.ones(2)}, arch, what="x")
    with pytest.raises(ArchitectureMismatch, match="has tensor 'c'"):
        check_architecture(
            {"a": torch.ones(2), "b": torch.ones(3), "c": torch.ones(1)}, arch, what="x"
        )


def test_large_payloads_are_assembled_byte_identical_to_safetensors() -> None:
    # Above fresh_bytes.LARGE the bytes are filled in place (huge pages), not joined.
    tensors = {f"t{i}": torch.randn(1 << 20) for i in range(3)}
    tensors["h"] = torch.ones(5, dtype=torch.float16)
    data = encode(tensors, {})  # one metadata key: safetensors orders several at random
    assert type(data) is bytes and len(data) > 12 << 20
    assert data == st_save(tensors, metadata={"format": PAYLOAD_FORMAT})
    assert all(torch.equal(decode(data).tensors[k], v) for k, v in tensors.items())


def test_payload_pieces_join_to_the_payload_and_view_the_tensors() -> None:
    """What a checkpoint writes piece by piece is the payload, and no tensor was copied."""
    tensors = {k: v.clone() for k, v in MIXED.items()}
    parts = encode_parts(tensors, {"kind": "x"})
    assert b"".join(parts) == encode(tensors, {"kind": "x"})
    tensors["b"][0, 0] = 99.0  # a view sees the change; a copy would not
    assert b"".join(parts) == encode(tensors, {"kind": "x"})
    assert len(parts) == 1 + sum(1 for t in MIXED.values() if t.numel())


def test_a_checkpoint_file_holds_the_encoded_bytes(tmp_path: Path) -> None:
    from lensemble.durable import atomic_write

    parts = encode_parts(MIXED, {"kind": "x"})
    atomic_write(tmp_path / "ckpt.safetensors", parts)
    assert (tmp_path / "ckpt.safetensors").read_bytes() == encode(MIXED, {"kind": "x"})
