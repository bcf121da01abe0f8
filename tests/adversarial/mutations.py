"""Structure-aware mutations of a valid pseudo-gradient payload, for the payload fuzzer.

Each mutation starts from the bytes a real participant sealed for the open round and damages one
thing the way a hostile or buggy participant could: the header's JSON structure and nesting, a
tensor's dtype, shape or offsets, the declared header length, the buffer's length, the metadata
(unknown keys, long or non-string values, absurd statistics), the tensor values (NaN, Inf, huge,
subnormal) or, in int8, the scales. Everything is drawn from one ``random.Random``: a fixed seed
gives the same cases on every machine.
"""

from __future__ import annotations

import contextlib
import json
import random
import struct
from collections.abc import Callable
from typing import Any

SPECIAL_F32 = (
    float("nan"),
    float("inf"),
    float("-inf"),
    3.0e38,
    -3.0e38,
    1e4,
    2.6e36,
    1e-45,
    0.0,
    -0.0,
)
BAD_DTYPES: tuple[Any, ...] = ("BOOL", "U16", "F8_E4M3", "", "f32", 5, None, [], "F32" * 50)
BAD_INTS: tuple[Any, ...] = (-1, 2**31, 2**63, 2**64 + 1, 1.5, "3", None, True, [], {})


class Payload:
    """A payload split into its header (parsed) and data buffer."""

    def __init__(self, data: bytes) -> None:
        (length,) = struct.unpack("<Q", data[:8])
        self.header: dict[str, Any] = json.loads(data[8 : 8 + length])
        self.buffer = bytearray(data[8 + length :])

    def tensors(self) -> list[str]:
        return sorted(k for k in self.header if k != "__metadata__")

    def pack(self, header_text: bytes | None = None) -> bytes:
        text = header_text if header_text is not None else json.dumps(self.header).encode()
        return struct.pack("<Q", len(text)) + text + bytes(self.buffer)


def _nested(rng: random.Random) -> bytes:
    depth = rng.choice((5, 50, 1000, 5000, 100_000))
    opener = rng.choice((b"[", b'{"a":', b'[{"a":'))
    closer = {b"[": b"]", b'{"a":': b"}", b'[{"a":': b"}]"}[opener]
    inner = opener * depth + b"1" + (closer * depth if rng.random() < 0.5 else b"")
    return inner


def m_nesting(p: Payload, rng: random.Random) -> bytes:
    where = rng.randrange(3)
    deep = _nested(rng)
    if where == 0:
        return p.pack(deep)
    if where == 1:  # deep value inside a tensor entry
        text = json.dumps(p.header).encode()
        name = rng.choice(p.tensors()).encode()
        key = b'"' + name + b'":{'
        return p.pack(text.replace(key, key + b'"x":' + deep + b",", 1))
    text = json.dumps(p.header).encode()  # deep metadata value
    return p.pack(text.replace(b'"__metadata__":{', b'"__metadata__":{"x":' + deep + b",", 1))


def m_structure(p: Payload, rng: random.Random) -> bytes:
    choice = rng.randrange(8)
    if choice == 0:
        return p.pack(rng.choice((b"[]", b"1", b'"x"', b"null", b"{}", b"", b" ", b"\xff\xfe")))
    if choice == 1:
        del p.header[rng.choice(p.tensors())]
    elif choice == 2:
        name = rng.choice(p.tensors())
        p.header[name + rng.choice(("x", "::scale", "\u0000", "é" * 300))] = dict(p.header[name])
    elif choice == 3:
        p.header[rng.choice(p.tensors())] = rng.choice(([], 1, "F32", None, {"dtype": "F32"}))
    elif choice == 4:  # a duplicate key in the raw text
        text = json.dumps(p.header).encode()
        name = rng.choice(p.tensors()).encode()
        entry = json.dumps(p.header[name.decode()]).encode()
        return p.pack(text[:-1] + b',"' + name + b'":' + entry + b"}")
    elif choice == 5:
        p.header["__metadata__"] = rng.choice(([], 1, None, {"format": 1}, {"a": {"b": "c"}}))
    elif choice == 6:
        name = rng.choice(p.tensors())
        p.header[name].pop(rng.choice(("dtype", "shape", "data_offsets")))
    else:
        for name in p.tensors()[: rng.randrange(1, 4)]:
            p.header[name]["extra"] = rng.choice((1, "x", [1, 2], {"y": 1}))
    return p.pack()


def m_dtype(p: Payload, rng: random.Random) -> bytes:
    name = rng.choice(p.tensors())
    p.header[name]["dtype"] = rng.choice(
        (*BAD_DTYPES, "F16", "BF16", "F64", "I8", "I32", "I64", "U8", "F32")
    )
    return p.pack()


def m_shape(p: Payload, rng: random.Random) -> bytes:
    name = rng.choice(p.tensors())
    shape = list(p.header[name]["shape"])
    choice = rng.randrange(6)
    if choice == 0 and shape:
        shape[rng.randrange(len(shape))] = rng.choice(BAD_INTS)
    elif choice == 1:
        shape = shape[::-1] if len(shape) > 1 else [*shape, 1]
    elif choice == 2:
        shape = [1] * rng.choice((9, 64, 1000))
    elif choice == 3:
        shape = [2**32, 2**32] if rng.random() < 0.5 else [0]
    elif choice == 4:
        shape = rng.choice(([], "3", None, {"a": 1}, [[1]]))
    else:
        shape = [*shape, rng.choice((0, 1, 2))]
    p.header[name]["shape"] = shape
    return p.pack()


def m_offsets(p: Payload, rng: random.Random) -> bytes:
    name = rng.choice(p.tensors())
    start, stop = p.header[name]["data_offsets"]
    size = len(p.buffer)
    p.header[name]["data_offsets"] = rng.choice(
        (
            [stop, start],
            [start, stop + 4],
            [start, size + rng.choice((1, 8, 2**40))],
            [start - 4, stop - 4],
            [rng.choice(BAD_INTS), stop],
            [start, rng.choice(BAD_INTS)],
            [start],
            [start, stop, stop],
            [0, 0],
            "0,4",
        )
    )
    return p.pack()


def m_lengths(p: Payload, rng: random.Random) -> bytes:
    data = p.pack()
    (length,) = struct.unpack("<Q", data[:8])
    choice = rng.randrange(5)
    if choice == 0:
        new = rng.choice((0, 1, 7, length - 1, length + 1, length + 8, len(data), 2**64 - 1))
        return struct.pack("<Q", max(0, new)) + data[8:]
    if choice == 1:
        return data[: rng.randrange(len(data))]
    if choice == 2:
        return data + bytes(rng.randrange(1, 64))
    if choice == 3:  # a header padded with a huge run of spaces
        text = json.dumps(p.header).encode() + b" " * rng.choice((8, 70_000, 1_000_000))
        return p.pack(text)
    return rng.randbytes(rng.randrange(0, 256))


def m_metadata(p: Payload, rng: random.Random) -> bytes:
    meta = p.header.setdefault("__metadata__", {})
    choice = rng.randrange(7)
    if choice == 0:
        meta[rng.choice(("evil", "x" * 200, "", "\n", "mean_loss "))] = "1"
    elif choice == 1:
        meta[rng.choice(sorted(meta))] = "v" * rng.choice((129, 10_000, 300_000))
    elif choice == 2:
        meta["mean_loss"] = rng.choice(("1e300", "nan", "inf", "-1e300", "x", "", "1" * 128))
    elif choice == 3:
        meta["compute_s"] = rng.choice(("-5", "1e300", "nan", "12.5", "0x10"))
    elif choice == 4:
        meta[rng.choice(sorted(meta))] = rng.choice((1, None, [], {"a": "b"}, 1.5))
    elif choice == 5:
        meta.pop(rng.choice(sorted(meta)))
    else:
        key = rng.choice(("round", "participant", "quantization", "int8_chunk", "base_hash"))
        meta[key] = rng.choice(("-1", "999999", "alpha", "int8", "fp16", "", "sha256:" + "0" * 64))
    return p.pack()


def _f32_positions(p: Payload, names: list[str]) -> list[tuple[int, int]]:
    out = []
    for name in names:
        entry = p.header[name]
        if entry["dtype"] == "F32":
            start, stop = entry["data_offsets"]
            out.append((start, stop))
    return out


def m_values(p: Payload, rng: random.Random) -> bytes:
    spans = _f32_positions(p, p.tensors())
    start, stop = rng.choice(spans)
    value = struct.pack("<f", rng.choice(SPECIAL_F32))
    if rng.random() < 0.5:  # one element
        at = start + 4 * rng.randrange((stop - start) // 4)
        p.buffer[at : at + 4] = value
    else:  # every element of the tensor
        p.buffer[start:stop] = value * ((stop - start) // 4)
    return p.pack()


def m_int8(p: Payload, rng: random.Random) -> bytes:
    names = p.tensors()
    scales = [n for n in names if n.endswith("::scale")]
    if not scales:
        return m_values(p, rng)
    if rng.random() < 0.6:
        start, stop = rng.choice(_f32_positions(p, scales))
        value = rng.choice((*SPECIAL_F32, -1.0, 1e3, 11.0, 9.9))
        p.buffer[start:stop] = struct.pack("<f", value) * ((stop - start) // 4)
    else:  # every code at the extreme
        codes = [n for n in names if p.header[n]["dtype"] == "I8"]
        start, stop = p.header[rng.choice(codes)]["data_offsets"]
        p.buffer[start:stop] = bytes([rng.choice((0x7F, 0x81, 0x80))]) * (stop - start)
    return p.pack()


def m_bytes(p: Payload, rng: random.Random) -> bytes:
    data = bytearray(p.pack())
    for _ in range(rng.randrange(1, 8)):
        at = rng.randrange(len(data))
        data[at] = rng.randrange(256)
    return bytes(data)


#: Each mutation with its weight: parser-level damage is drawn more often than the value and
#: metadata changes, which are often accepted (and each accepted case ends the attacker's turn).
MUTATIONS: tuple[tuple[Callable[[Payload, random.Random], bytes], int], ...] = (
    (m_nesting, 3),
    (m_structure, 4),
    (m_dtype, 3),
    (m_shape, 3),
    (m_offsets, 3),
    (m_lengths, 3),
    (m_metadata, 1),
    (m_values, 1),
    (m_int8, 1),
    (m_bytes, 2),
)
_FUNCTIONS = [m for m, _ in MUTATIONS]
_WEIGHTS = [w for _, w in MUTATIONS]


def mutate(valid: bytes, rng: random.Random) -> bytes:
    """One mutated case of a valid payload; sometimes two mutations stacked."""
    data = rng.choices(_FUNCTIONS, _WEIGHTS)[0](Payload(valid), rng)
    if rng.random() < 0.1:
        # The first mutation may leave nothing structured to mutate again.
        broken = (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError)
        with contextlib.suppress(*broken, struct.error):
            data = rng.choices(_FUNCTIONS, _WEIGHTS)[0](Payload(data), rng)
    return data
