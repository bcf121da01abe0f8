"""Serialized payloads (safetensors) and the canonical hash of a set of named tensors.

Every tensor that crosses a process or trust-domain boundary is a safetensors payload: a JSON
header (names, dtypes, shapes, string metadata) followed by raw little-endian bytes. Nothing is
ever unpickled: :func:`decode` reads that header as JSON and the tensors as views of the buffer,
checked against safetensors' layout rules.

The canonical tensor hash does not depend on safetensors' own byte layout: SHA-256 over a domain
tag, then for each tensor in sorted name order its name, dtype, shape and raw bytes (all
lengths as little-endian integers), then a caller-supplied suffix (round index, parent hash).
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from lensemble.errors import ArchitectureMismatch, PayloadError
from lensemble.federation import strict_json
from lensemble.machinery.fresh_bytes import LARGE, BytesBuilder
from lensemble.machinery.hash_behind import HashBehind

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


class TensorDigest:
    """:func:`tensor_digest` computed incrementally, one tensor at a time.

    Tensors must be added in strictly increasing name order (the canonical order); the digest
    of everything added, then :meth:`hexdigest`, equals :func:`tensor_digest` of the same
    tensors. It is the one definition of the hashed byte stream: :func:`tensor_digest` and
    :func:`model_hash_behind` both feed it.
    """

    def __init__(self) -> None:
        self._h = hashlib.sha256(MODEL_HASH_DOMAIN)
        self.names: list[str] = []

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Hash one named tensor (any supported dtype and shape, CPU).

        Raises:
            ValueError: ``name`` does not sort after the previous tensor's name.
            PayloadError: The dtype is not one Lensemble sends.
        """
        if self.names and name <= self.names[-1]:
            raise ValueError(
                f"tensor '{name}' does not sort after '{self.names[-1]}': tensors are hashed "
                "in sorted name order."
            )
        t = tensor.detach().cpu().contiguous()
        encoded = name.encode()
        token = dtype_token(t.dtype).encode()
        shape = b"".join(struct.pack("<Q", d) for d in t.shape)
        self._h.update(
            struct.pack("<I", len(encoded))
            + encoded
            + struct.pack("<B", len(token))
            + token
            + struct.pack("<I", t.dim())
            + shape
        )
        # A byte view avoids a copy and is exact for every dtype, bfloat16 included.
        self._h.update(t.reshape(-1).view(torch.uint8).numpy().data)
        self.names.append(name)

    def hexdigest(self, suffix: bytes = b"") -> str:
        """The lower-case hex digest (64 characters) with ``suffix`` bound after the tensors."""
        h = self._h.copy()
        h.update(suffix)
        return h.hexdigest()


def tensor_digest(tensors: Mapping[str, torch.Tensor], suffix: bytes = b"") -> str:
    """Canonical SHA-256 of named tensors, independent of dict order and serialization.

    Args:
        tensors: Name -> CPU tensor of any supported dtype and shape.
        suffix: Extra bytes bound into the digest (e.g. round index and parent hash).

    Returns:
        Lower-case hex digest (64 characters).
    """
    digest = TensorDigest()
    for name in sorted(tensors):
        digest.add(name, tensors[name])
    return digest.hexdigest(suffix)


def model_hash_suffix(version: int, parent_hash: str) -> bytes:
    """The bytes a model hash binds after its tensors: the version, then the parent's hash."""
    return struct.pack("<Q", version) + parent_hash.encode()


def model_hash(params: Mapping[str, torch.Tensor], version: int, parent_hash: str) -> str:
    """Hash of global model version ``version``: tensors, version and parent (a hash chain).

    Args:
        params: Global parameters (float32).
        version: Model version; version 0 is the initial model, round t commits t + 1.
        parent_hash: Hash of version - 1, or ``""`` for version 0.

    Returns:
        ``"sha256:<64 hex>"``.
    """
    return "sha256:" + tensor_digest(params, model_hash_suffix(version, parent_hash))


def model_hash_behind(version: int, parent_hash: str) -> HashBehind:
    """:func:`model_hash` of tensors handed over one at a time, hashed on the hashing thread.

    Feed it every tensor in sorted name order (:meth:`HashBehind.add`); :meth:`HashBehind.result`
    is then bit-identical to ``model_hash`` of the same tensors (both feed :class:`TensorDigest`).

    Args:
        version: The model version the tensors are (``t + 1`` for round ``t``'s new model).
        parent_hash: The hash of version ``version - 1``.
    """
    return HashBehind(TensorDigest(), model_hash_suffix(version, parent_hash))


def bytes_hash(data: bytes | memoryview) -> str:
    """``"sha256:<hex>"`` of raw bytes, or of a view of them (payload integrity on the wire)."""
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
_TOKEN_DTYPES = {token: dtype for dtype, token in _DTYPE_TOKENS.items()}
_ITEM_BYTES = {
    token: torch.empty((), dtype=dtype).element_size() for token, dtype in _TOKEN_DTYPES.items()
}


def encode(
    tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str], *, recycle: bool = True
) -> bytes:
    """Serialize named tensors plus string metadata in the safetensors format.

    The layout is exactly ``safetensors.torch.save``'s (tensors ordered by dtype then name, the
    header padded to 8 bytes; a test checks byte equality), with two differences that matter
    here: metadata keys are sorted, so the same payload always has the same bytes (safetensors
    writes them in hash-map order, which varies between processes, and a resend must be
    byte-identical to count as a duplicate); and each tensor is copied once instead of twice,
    which made safetensors' writer the slowest step of a round
    (docs/performance.md#block-sizes-and-buffers-of-the-hot-path).
    Untrusted bytes are parsed by :func:`decode` under safetensors' layout rules.

    Args:
        tensors: Name -> CPU tensor.
        metadata: String key/value pairs stored in the header (``format`` is added).
        recycle: A large payload may write over this process's last released payload of
            the same size (:mod:`~lensemble.machinery.fresh_bytes`); False always allocates.

    Returns:
        The payload bytes; their length is the exact number of bytes sent.
    """
    parts = encode_parts(tensors, metadata)
    return _joined(parts, sum(len(part) for part in parts), recycle=recycle)


def encode_parts(
    tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]
) -> list[bytes | memoryview]:
    """:func:`encode`'s bytes as pieces, without copying a tensor: the header, then each tensor.

    For a writer that takes the pieces one after the other (a checkpoint file): the file's
    bytes are exactly :func:`encode`'s, and no model-sized buffer is built for them.

    Args:
        tensors: Name -> CPU tensor (contiguous ones are viewed, others copied once).
        metadata: As for :func:`encode`.

    Returns:
        The header (with its length prefix) and a byte view of every non-empty tensor, in file
        order; valid while the tensors are neither changed nor freed.
    """
    prepared = [(name, t.detach().cpu().contiguous()) for name, t in tensors.items()]
    prepared.sort(key=lambda item: (-_ST_DTYPE_RANK[dtype_token(item[1].dtype)], item[0]))
    meta = {"format": PAYLOAD_FORMAT, **metadata}
    header: dict[str, object] = {"__metadata__": dict(sorted(meta.items()))}
    chunks: list[memoryview] = []
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
    return [struct.pack("<Q", len(text)) + text, *chunks]


def _joined(parts: list[bytes | memoryview], total: int, *, recycle: bool = True) -> bytes:
    """``b"".join(parts)`` (``total`` bytes), at memory bandwidth for large payloads.

    Built in place (:class:`~lensemble.machinery.fresh_bytes.BytesBuilder`): ``b"".join``
    is several times slower, its fresh buffer faulted in 4 KiB page by page
    (docs/performance.md#block-sizes-and-buffers-of-the-hot-path). With ``recycle`` the
    previous payload of the same size, once released (a round's model or update), is written
    over, not faulted in anew.
    """
    if total < LARGE:
        return b"".join(parts)
    builder = BytesBuilder(total, recycle=recycle)
    for part in parts:
        builder.write(part)
    return builder.finish()


@dataclass(frozen=True)
class TensorRange:
    """Where one tensor's bytes lie in a payload's data section.

    Attributes:
        name: Tensor name.
        dtype: Safetensors dtype token (``F32``, ``I8`` ...).
        shape: Dimensions.
        begin: First byte, counted from the start of the data section.
        end: One past the last byte.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Decoded:
    """A parsed payload.

    Attributes:
        tensors: Name -> CPU tensor.
        metadata: Header metadata (strings).
        data_start: Byte where the data section starts (8 + header length).
        layout: Every tensor's byte range, in file order (ascending offsets).
    """

    tensors: dict[str, torch.Tensor]
    metadata: dict[str, str]
    data_start: int = 0
    layout: tuple[TensorRange, ...] = ()


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


#: Bits one tensor may span: torch's sizes are signed 64-bit (the reference allows unsigned).
_EXTENT_LIMIT = 2**63


def _parse_header(raw: bytes) -> object:
    """The header's JSON, read as strictly as the reference parser reads it (:mod:`strict_json`).

    Raises:
        PayloadError: Not UTF-8, or not JSON the reference parser would read.
    """
    try:
        return strict_json.loads(raw)
    except UnicodeDecodeError as exc:
        reason = f"{exc.reason} at byte {exc.start}"
        raise PayloadError(f"payload header is not UTF-8 ({reason}).") from None
    except (ValueError, RecursionError) as exc:
        raise PayloadError(f"payload header is not valid JSON: {str(exc)[:120]}.") from None


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
        else:
            _check_entry(name, entry)
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise PayloadError("payload metadata is not an object of strings.")
    return metadata


def _check_entry(name: str, entry: object) -> None:
    """One tensor entry: a supported dtype, a bounded integer shape, two integer offsets."""
    if not isinstance(entry, dict):
        raise PayloadError(f"payload header entry '{name[:64]}' is not an object.")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in _ST_DTYPE_RANK:
        raise PayloadError(f"tensor '{name[:64]}' has unsupported dtype {str(dtype)[:16]!r}.")
    _check_shape(name, dtype, shape)
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(type(o) is int and o >= 0 for o in offsets)
    ):
        raise PayloadError(f"tensor '{name[:64]}' has invalid data offsets.")


def _check_shape(name: str, dtype: str, shape: object) -> None:
    """A list of at most :data:`MAX_TENSOR_RANK` non-negative integers that torch can address."""
    if not (
        isinstance(shape, list)
        and len(shape) <= MAX_TENSOR_RANK
        and all(type(d) is int and d >= 0 for d in shape)
    ):
        raise PayloadError(f"tensor '{name[:64]}' has an invalid shape.")
    extent = _ITEM_BYTES[dtype] * 8
    for d in shape:
        extent *= max(d, 1)  # also bounds every dimension of an empty tensor
    if extent >= _EXTENT_LIMIT:
        raise PayloadError(f"tensor '{name[:64]}' has a shape too large to address.")


def _tensor_layout(header: Mapping[str, object], data_len: int) -> list[TensorRange]:
    """Check that the tensors' offsets tile the data section exactly; return them in file order.

    These are safetensors' own rules (each tensor's byte range matches its dtype and shape, the
    ranges are contiguous from 0, without gaps or overlaps, and end where the buffer ends),
    applied here so that tensors can be views of the buffer instead of copies.

    Raises:
        PayloadError: A range does not match its shape, ranges overlap or leave a gap, or the
            buffer is longer or shorter than the ranges.
    """
    entries = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        assert isinstance(entry, dict)  # _check_header ran first
        begin, end = entry["data_offsets"]
        numel = 1
        for d in entry["shape"]:
            numel *= d
        if end - begin != numel * _ITEM_BYTES[entry["dtype"]]:
            raise PayloadError(
                f"payload is not valid safetensors: tensor '{name[:64]}' spans {end - begin} "
                f"bytes, its dtype and shape need {numel * _ITEM_BYTES[entry['dtype']]}."
            )
        entries.append(TensorRange(name, entry["dtype"], tuple(entry["shape"]), begin, end))
    entries.sort(key=lambda e: (e.begin, e.end))
    position = 0
    for name, _, _, begin, end in ((e.name, e.dtype, e.shape, e.begin, e.end) for e in entries):
        if begin != position:
            raise PayloadError(
                f"payload is not valid safetensors: tensor '{name[:64]}' starts at byte {begin} "
                f"of the data, expected {position} (tensors overlap or leave a gap)."
            )
        position = end
    if position != data_len:
        raise PayloadError(
            f"payload is not valid safetensors: its data is {data_len} bytes but its tensors "
            f"cover {position}: truncated or padded."
        )
    return entries


def decode(
    data: bytes | bytearray | memoryview,
    *,
    max_header_bytes: int = MAX_HEADER_BYTES,
    copy: bool = True,
) -> Decoded:
    """Parse safetensors bytes without unpickling anything.

    Untrusted bytes are bounded before they are parsed: the header's size
    (``max_header_bytes``) and JSON nesting (:data:`MAX_HEADER_DEPTH`), then read as strictly
    as the reference safetensors parser reads it (:func:`_parse_header`), then its structure
    (supported dtypes, integer shapes and offsets, string metadata), then safetensors' layout
    rules (each tensor's byte range matches its dtype and shape, the ranges tile the data
    section exactly). Whatever it accepts, the reference parser accepts too, with the same
    tensors (differential-fuzzed: ``tests/federation/test_payload_differential.py``).

    Args:
        data: The payload bytes (any contiguous buffer).
        max_header_bytes: Largest header accepted (bytes).
        copy: True (default): the tensors share one fresh writable copy of the data section
            (one copy, however many tensors). False: the tensors are views of ``data`` itself,
            no copy at all; the caller must then neither write to them nor change ``data``
            while they are in use (the coordinator's judging path, which only reads).

    Raises:
        PayloadError: The header is too large, too deep or malformed, the buffer is truncated,
            or the format tag is not ``lensemble-payload-v1``. Nothing else.
    """
    view = memoryview(data).cast("B")
    if len(view) < 8:
        raise PayloadError(f"payload is truncated: {len(view)} bytes, not even a header.")
    header_len = struct.unpack("<Q", view[:8])[0]
    if header_len > len(view) - 8:
        raise PayloadError(
            f"payload is truncated or its header is corrupt: the header declares {header_len} "
            f"bytes but only {len(view) - 8} follow."
        )
    if header_len > max_header_bytes:
        raise PayloadError(
            f"payload header is {header_len} bytes, more than the {max_header_bytes} allowed."
        )
    raw = bytes(view[8 : 8 + header_len])
    if not raw.startswith(b"{"):
        raise PayloadError("payload header does not start with '{'.")
    if _nesting_depth(raw) > MAX_HEADER_DEPTH:
        raise PayloadError(f"payload header nests deeper than {MAX_HEADER_DEPTH} levels.")
    header = _parse_header(raw)
    metadata = _check_header(header)
    assert isinstance(header, dict)  # _check_header refuses anything else
    body = view[8 + header_len :]
    layout = _tensor_layout(header, len(body))
    if metadata.get("format") != PAYLOAD_FORMAT:
        raise PayloadError(
            f"payload format is {str(metadata.get('format'))[:64]!r}, expected "
            f"{PAYLOAD_FORMAT!r}; check both sides run the same Lensemble version."
        )
    if copy:
        body = memoryview(bytearray(body))
    tensors: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings():
        # A read-only buffer (copy=False) is shared on purpose; the caller only reads it.
        warnings.simplefilter("ignore", UserWarning)
        for name, token, shape, begin, end in (
            (e.name, e.dtype, e.shape, e.begin, e.end) for e in layout
        ):
            dtype = _TOKEN_DTYPES[token]
            if begin == end:
                tensors[name] = torch.empty(shape, dtype=dtype)
                continue
            part = body[begin:end]
            t = torch.frombuffer(part, dtype=torch.uint8)
            if t.data_ptr() % _ITEM_BYTES[token]:
                t = t.clone()  # a misaligned range (not one encode writes): copy it aligned
            tensors[name] = t.view(dtype).reshape(shape)
    return Decoded(
        tensors=tensors, metadata=dict(metadata), data_start=8 + header_len, layout=tuple(layout)
    )


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
