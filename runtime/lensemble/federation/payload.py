"""Serialized payloads (safetensors) and the canonical hash of a set of named tensors.

Every tensor that crosses a process or trust-domain boundary is a safetensors payload: a JSON
header (names, dtypes, shapes, string metadata) followed by raw little-endian bytes. Nothing is
ever unpickled: parsing is ``safetensors.torch.load``, which only reads that header and buffer.

The canonical tensor hash does not depend on safetensors' own byte layout: SHA-256 over a domain
tag, then for each tensor in sorted name order its name, dtype, shape and raw bytes (all
lengths as little-endian integers), then a caller-supplied suffix (round index, parent hash).
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load

from lensemble.errors import ArchitectureMismatch, PayloadError

PAYLOAD_FORMAT = "lensemble-payload-v1"
MODEL_HASH_DOMAIN = b"lensemble/global-model/v1\x00"

_DTYPE_TOKENS: dict[torch.dtype, str] = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int8: "I8",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.uint8: "U8",
}


def dtype_token(dtype: torch.dtype) -> str:
    """Short stable name of a dtype (safetensors' spelling), e.g. ``F32``.

    Raises:
        PayloadError: The dtype is not one Lensemble sends.
    """
    try:
        return _DTYPE_TOKENS[dtype]
    except KeyError:
        raise PayloadError(f"dtype {dtype} is not supported in payloads.") from None


def tensor_digest(tensors: Mapping[str, torch.Tensor], suffix: bytes = b"") -> str:
    """Canonical SHA-256 of named tensors, independent of dict order and serialization.

    Args:
        tensors: Name -> CPU tensor of any supported dtype and shape.
        suffix: Extra bytes bound into the digest (e.g. round index and parent hash).

    Returns:
        Lower-case hex digest (64 characters).
    """
    h = hashlib.sha256(MODEL_HASH_DOMAIN)
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        encoded = name.encode()
        token = dtype_token(t.dtype).encode()
        h.update(struct.pack("<I", len(encoded)) + encoded)
        h.update(struct.pack("<B", len(token)) + token)
        h.update(struct.pack("<I", t.dim()) + b"".join(struct.pack("<Q", d) for d in t.shape))
        # A byte view avoids a copy and is exact for every dtype, bfloat16 included.
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    h.update(suffix)
    return h.hexdigest()


def model_hash(params: Mapping[str, torch.Tensor], version: int, parent_hash: str) -> str:
    """Hash of global model version ``version``: tensors, version and parent (a hash chain).

    Args:
        params: Global parameters (float32).
        version: Model version; version 0 is the initial model, round t commits t + 1.
        parent_hash: Hash of version - 1, or ``""`` for version 0.

    Returns:
        ``"sha256:<64 hex>"``.
    """
    suffix = struct.pack("<Q", version) + parent_hash.encode()
    return "sha256:" + tensor_digest(params, suffix)


def bytes_hash(data: bytes) -> str:
    """``"sha256:<hex>"`` of raw bytes (payload integrity on the wire)."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


# safetensors orders tensors by dtype (its enum order, descending), then by name.
_ST_DTYPE_RANK = {
    "U8": 4,
    "I8": 5,
    "F16": 11,
    "BF16": 12,
    "I32": 13,
    "F32": 15,
    "F64": 17,
    "I64": 18,
}


def encode(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> bytes:
    """Serialize named tensors plus string metadata in the safetensors format.

    The layout is exactly ``safetensors.torch.save``'s (tensors ordered by dtype then name, the
    header padded to 8 bytes; a test checks byte equality), with two differences that matter
    here: metadata keys are sorted, so the same payload always has the same bytes (safetensors
    writes them in hash-map order, which varies between processes, and a resend must be
    byte-identical to count as a duplicate); and each tensor is copied once instead of twice,
    which made safetensors' writer the slowest step of a round (``bench/runtime_overhead.py``).
    Untrusted bytes are still parsed by safetensors (:func:`decode`).

    Args:
        tensors: Name -> CPU tensor.
        metadata: String key/value pairs stored in the header (``format`` is added).

    Returns:
        The payload bytes; their length is the exact number of bytes sent.
    """
    prepared = [(name, t.detach().cpu().contiguous()) for name, t in tensors.items()]
    prepared.sort(key=lambda item: (-_ST_DTYPE_RANK[dtype_token(item[1].dtype)], item[0]))
    meta = {"format": PAYLOAD_FORMAT, **metadata}
    header: dict[str, object] = {"__metadata__": dict(sorted(meta.items()))}
    chunks: list[object] = []
    offset = 0
    for name, t in prepared:
        size = t.numel() * t.element_size()
        header[name] = {
            "dtype": dtype_token(t.dtype),
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
        if size:
            chunks.append(t.reshape(-1).view(torch.uint8).numpy().data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)  # the data section starts 8-byte aligned
    return b"".join([struct.pack("<Q", len(text)), text, *chunks])  # type: ignore[list-item]


@dataclass(frozen=True)
class Decoded:
    """A parsed payload.

    Attributes:
        tensors: Name -> CPU tensor.
        metadata: Header metadata (strings).
    """

    tensors: dict[str, torch.Tensor]
    metadata: dict[str, str]


#: Largest header :func:`decode` accepts by default (bytes); safetensors' own limit is 100 MB.
MAX_HEADER_BYTES = 16 * 1024 * 1024
#: Deepest JSON nesting of a header: a payload's is 3 (header -> tensor -> shape list).
MAX_HEADER_DEPTH = 4
#: Most dimensions of one tensor in a payload.
MAX_TENSOR_RANK = 8
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OPENERS = frozenset(b"[{")
_CLOSERS = frozenset(b"]}")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def _nesting_depth(header: bytes) -> int:
    """Deepest bracket nesting of JSON text, ignoring brackets inside strings.

    Runs before ``json.loads`` so that hostile nesting (thousands of ``[``) is refused in
    linear time instead of exhausting the parser's recursion limit.
    """
    depth = deepest = 0
    for byte in _STRING.sub(b"", header).translate(None, _NOT_BRACKETS):
        if byte in _OPENERS:
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_HEADER_DEPTH:
                    break
        elif byte in _CLOSERS:
            depth -= 1
    return deepest


def _check_header(header: object) -> dict[str, str]:
    """Check a parsed header's structure; return its metadata.

    Raises:
        PayloadError: Not an object, a tensor entry without a supported dtype, an integer shape
            of at most :data:`MAX_TENSOR_RANK` dimensions and two integer offsets, or metadata
            that is not a string -> string object.
    """
    if not isinstance(header, dict):
        raise PayloadError(f"payload header is a JSON {type(header).__name__}, not an object.")
    metadata: object = {}
    for name, entry in header.items():
        if name == "__metadata__":
            metadata = entry
            continue
        if not isinstance(entry, dict):
            raise PayloadError(f"payload header entry '{name[:64]}' is not an object.")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in _ST_DTYPE_RANK:
            raise PayloadError(f"tensor '{name[:64]}' has unsupported dtype {str(dtype)[:16]!r}.")
        if not (
            isinstance(shape, list)
            and len(shape) <= MAX_TENSOR_RANK
            and all(type(d) is int and d >= 0 for d in shape)
        ):
            raise PayloadError(f"tensor '{name[:64]}' has an invalid shape.")
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(type(o) is int and o >= 0 for o in offsets)
        ):
            raise PayloadError(f"tensor '{name[:64]}' has invalid data offsets.")
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise PayloadError("payload metadata is not an object of strings.")
    return metadata


def decode(data: bytes, *, max_header_bytes: int = MAX_HEADER_BYTES) -> Decoded:
    """Parse safetensors bytes without unpickling anything.

    Untrusted bytes are bounded before they are parsed: the header's size
    (``max_header_bytes``) and JSON nesting (:data:`MAX_HEADER_DEPTH`), then its structure
    (supported dtypes, integer shapes and offsets, string metadata), then safetensors checks
    that offsets, shapes and the buffer agree.

    Args:
        data: The payload bytes.
        max_header_bytes: Largest header accepted (bytes).

    Raises:
        PayloadError: The header is too large, too deep or malformed, the buffer is truncated,
            or the format tag is not ``lensemble-payload-v1``. Nothing else.
    """
    if len(data) < 8:
        raise PayloadError(f"payload is truncated: {len(data)} bytes, not even a header.")
    header_len = struct.unpack("<Q", data[:8])[0]
    if header_len > len(data) - 8:
        raise PayloadError(
            f"payload is truncated or its header is corrupt: the header declares {header_len} "
            f"bytes but only {len(data) - 8} follow."
        )
    if header_len > max_header_bytes:
        raise PayloadError(
            f"payload header is {header_len} bytes, more than the {max_header_bytes} allowed."
        )
    raw = bytes(data[8 : 8 + header_len])
    if _nesting_depth(raw) > MAX_HEADER_DEPTH:
        raise PayloadError(f"payload header nests deeper than {MAX_HEADER_DEPTH} levels.")
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise PayloadError(f"payload header is not valid JSON: {str(exc)[:120]}.") from None
    metadata = _check_header(header)
    try:
        tensors = st_load(bytes(data))
    except (SafetensorError, ValueError, TypeError, RuntimeError, OverflowError) as exc:
        raise PayloadError(f"payload is not valid safetensors: {str(exc)[:200]}.") from None
    if metadata.get("format") != PAYLOAD_FORMAT:
        raise PayloadError(
            f"payload format is {str(metadata.get('format'))[:64]!r}, expected "
            f"{PAYLOAD_FORMAT!r}; check both sides run the same Lensemble version."
        )
    return Decoded(tensors=dict(tensors), metadata=dict(metadata))


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and dtype of one global-model parameter."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


def manifest(params: Mapping[str, torch.Tensor]) -> dict[str, TensorSpec]:
    """The architecture of a parameter set: name -> shape and dtype."""
    return {name: TensorSpec(name, tuple(t.shape), t.dtype) for name, t in sorted(params.items())}


def check_architecture(
    tensors: Mapping[str, torch.Tensor], expected: Mapping[str, TensorSpec], *, what: str
) -> None:
    """Require exactly the expected tensor names, shapes and dtypes.

    Raises:
        ArchitectureMismatch: Quoting the first differing tensor, and suggesting a version check.
    """
    fix = "check that every process runs the same Lensemble version and config (config hash)."
    for name in sorted(set(expected) | set(tensors)):
        if name not in tensors:
            raise ArchitectureMismatch(f"{what} lacks tensor '{name}';", remediation=fix)
        if name not in expected:
            raise ArchitectureMismatch(
                f"{what} has tensor '{name}', which the global model does not have;",
                remediation=fix,
            )
        got, spec = tensors[name], expected[name]
        if tuple(got.shape) != spec.shape or got.dtype != spec.dtype:
            raise ArchitectureMismatch(
                f"{what}: tensor '{name}' is {dtype_token(got.dtype)}{list(got.shape)}, the "
                f"global model has {dtype_token(spec.dtype)}{list(spec.shape)};",
                remediation=fix,
            )
