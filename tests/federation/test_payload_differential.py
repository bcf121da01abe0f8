"""Our payload parser accepts only what the reference ``safetensors`` parser accepts.

Differential fuzzing: a structure-aware generator writes safetensors payloads with the JSON
header spelled by hand (so it can hold what a JSON library would never write: duplicate keys,
``-0``, ``NaN``, ``1e400``, lone surrogate escapes, 2**64), in several encodings, with header
lengths and data sections right or wrong. For every payload our :func:`decode` accepts, the
reference (``safetensors.torch.load``) must accept it too and give the very same tensors; our
parser may be stricter, never looser. Before, our parser accepted 2,133 payloads the reference
refuses, and a UTF-16 header passed the nesting check.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load as reference_load

from lensemble.errors import PayloadError
from lensemble.federation.payload import PAYLOAD_FORMAT, decode

ITEM_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I8": 1, "I32": 4, "I64": 8, "U8": 1}
ODD_DTYPES = ["BOOL", "F8_E4M3", "U16", "f32", "", "F32 "]
NAMES = ["w", "b", "layer.0.weight", "", "é", "\\u00e9", "\\ud800", "a\\u0000b", "__metadata__"]
BIG = [2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30]


class Header:
    """One payload header, spelled as JSON text piece by piece by a seeded generator."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def number(self, honest: int) -> str:
        """``honest`` most of the time, else a number spelled to trip a parser."""
        if not self.chance(0.12):
            return str(honest)
        return self.rng.choice(
            [
                "-0",
                "-1",
                f"{honest}.0",
                f"{honest}e0",
                str(self.rng.choice(BIG)),
                "1e400",
                "NaN",
                "Infinity",
                "null",
                '"1"',
                f"[{honest}]",
                "9" * 30,
            ]
        )

    def obj(self, pairs: list[tuple[str, str]]) -> str:
        """A JSON object of already-spelled values, sometimes with a key repeated."""
        if pairs and self.chance(0.04):
            pairs = [*pairs, self.rng.choice(pairs)]
        if self.chance(0.5):
            self.rng.shuffle(pairs)
        sep = self.rng.choice([",", ", ", ",\n", ",\t"]) if self.chance(0.1) else ","
        return "{" + sep.join(f'"{k}":{v}' for k, v in pairs) + "}"

    def entry(self, dtype: str, shape: list[int], begin: int, end: int) -> str:
        spelled_dtype = f'"{dtype}"'
        if self.chance(0.05):
            spelled_dtype = self.rng.choice([f'"{d}"' for d in ODD_DTYPES] + ["1", "null"])
        dims = [self.number(d) for d in shape]
        if self.chance(0.03):
            dims += ["1"] * self.rng.randint(1, 9)
        spelled_shape = "[" + ",".join(dims) + "]"
        if self.chance(0.03):
            spelled_shape = self.rng.choice(["null", "{}", '"1"', "[[1]]", "4"])
        offsets = [self.number(begin), self.number(end)]
        if self.chance(0.03):
            offsets = self.rng.choice([[], offsets[:1], [*offsets, offsets[-1]]])
        pairs = [("dtype", spelled_dtype), ("shape", spelled_shape)]
        pairs.append(("data_offsets", "[" + ",".join(offsets) + "]"))
        if self.chance(0.08):
            odd = ["1", "NaN", "1e400", "-0", '"\\ud800"', "{}", "[[[]]]", '"x"', str(2**70)]
            pairs.append(("extra", self.rng.choice(odd)))
        if self.chance(0.03):
            del pairs[self.rng.randrange(len(pairs))]
        return self.obj(pairs)

    def metadata(self) -> str:
        tag = PAYLOAD_FORMAT if not self.chance(0.03) else "other"
        pairs = [("format", f'"{tag}"')]
        if self.chance(0.3):
            value = self.rng.choice(['"x"', '"\\ud800"', '"\\u00e9"', "1", "null", '{"a":"b"}'])
            pairs.append((self.rng.choice(["participant", "round", "é", "\\ud83d\\ude00"]), value))
        if self.chance(0.02):
            return self.rng.choice(["null", "{}", "[]", '"x"'])
        return self.obj(pairs)


def _shape(rng: random.Random) -> list[int]:
    rank = rng.choice([0, 1, 1, 2, 2, 3])
    return [rng.choice([0, 1, 1, 2, 3, 4]) for _ in range(rank)]


def generated_payload(rng: random.Random) -> bytes:
    """One payload: mostly valid, each part wrong now and then, as a hostile sender spells it."""
    gen = Header(rng)
    tensors = [
        (rng.choice(NAMES), rng.choice(list(ITEM_BYTES)), _shape(rng))
        for _ in range(rng.randint(0, 3))
    ]
    pairs: list[tuple[str, str]] = []
    offset = 0
    for name, dtype, shape in tensors:
        size = ITEM_BYTES[dtype]
        for d in shape:
            size *= d
        pairs.append((name, gen.entry(dtype, shape, offset, offset + size)))
        offset += size
    if not gen.chance(0.05):
        pairs.append(("__metadata__", gen.metadata()))
    text = gen.obj(pairs)
    if gen.chance(0.1):
        text += rng.choice([" " * rng.randint(1, 8), "\t", "\n", "\x00", "}", " x"])
    if gen.chance(0.02):
        text = rng.choice([" ", "\n", "\ufeff"]) + text
    raw = _encoded(text, rng)
    data = bytes(rng.getrandbits(8) for _ in range(offset))
    if gen.chance(0.05):
        data = data[: rng.randint(0, len(data))] if gen.chance(0.5) else data + b"\x00" * 4
    length = len(raw)
    if gen.chance(0.03):
        length = rng.choice([length - 1, length + 1, 0, 2**63, len(raw) + len(data)])
    return struct.pack("<Q", length % 2**64) + raw + data


def _encoded(text: str, rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.03:
        return text.encode(rng.choice(["utf-16-le", "utf-16-be", "utf-16", "utf-32-le"]))
    if roll < 0.05:
        raw = bytearray(text.encode("utf-8", "surrogatepass"))
        invalid = rng.choice([b"\xed\xa0\x80", b"\xc0\xaf", b"\xff", b"\x80"])
        at = raw.find(b'"w"') + 2 if b'"w"' in raw else 2
        return bytes(raw[:at] + invalid + raw[at:])
    return text.encode("utf-8", "surrogatepass")


def _reference(data: bytes) -> dict[str, torch.Tensor] | None:
    try:
        return reference_load(data)
    except (SafetensorError, RuntimeError, ValueError, TypeError, OverflowError):
        return None


def _ours(data: bytes) -> dict[str, torch.Tensor] | None:
    try:
        return decode(data).tensors
    except PayloadError:  # decode raises nothing else, on any input
        return None


def _looser(cases: int, seed: int) -> tuple[int, list[bytes]]:
    """How many payloads we accepted; those the reference refuses or reads otherwise."""
    rng = random.Random(seed)
    accepted, looser = 0, []
    for _ in range(cases):
        data = generated_payload(rng)
        ours = _ours(data)
        if ours is None:
            continue
        accepted += 1
        theirs = _reference(data)
        if theirs is None or not _same(ours, theirs):
            looser.append(data)
    return accepted, looser


def _same(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> bool:
    if set(ours) != set(theirs):
        return False
    return all(
        ours[k].dtype == theirs[k].dtype
        and ours[k].shape == theirs[k].shape
        and _raw(ours[k]) == _raw(theirs[k])
        for k in ours
    )


def _raw(t: torch.Tensor) -> bytes:
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy())


def _report(looser: list[bytes]) -> str:
    shown = [data[8 : 8 + 200] for data in looser[:5]]
    return f"{len(looser)} payloads accepted that the reference refuses or reads otherwise: {shown}"


def test_we_accept_only_what_the_reference_accepts() -> None:
    accepted, looser = _looser(4_000, seed=20_260_101)
    assert not looser, _report(looser)
    assert accepted > 500  # the generator writes valid payloads too, not only junk


@pytest.mark.integration
@pytest.mark.slow
def test_we_accept_only_what_the_reference_accepts_long() -> None:
    accepted, looser = _looser(200_000, seed=7)
    assert not looser, _report(looser)
    assert accepted > 25_000


Spelled = Callable[[], bytes]


def _payload(header: bytes, data: bytes = b"\x00" * 4) -> bytes:
    return struct.pack("<Q", len(header)) + header + data


ENTRY = b'"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'
META = b'"__metadata__":{"format":"' + PAYLOAD_FORMAT.encode() + b'"}'


@pytest.mark.parametrize(
    "header",
    [
        ("{" + (ENTRY + b"," + META).decode() + "}").encode("utf-16-le"),
        ("{" + (ENTRY + b"," + META).decode() + "}").encode("utf-32-le"),
        b"{" + ENTRY.replace(b'"w"', b'"\\ud800"') + b"," + META + b"}",
        b"{" + ENTRY.replace(b'"w"', b'"\xed\xa0\x80"') + b"," + META + b"}",
        b"{" + ENTRY.replace(b'"F32"', b'"F32","dtype":"F32"') + b"," + META + b"}",
        b"{" + ENTRY + b"," + META + b"," + META + b"}",
        b"{" + ENTRY.replace(b"[0,4]}", b'[0,4],"x":NaN}') + b"," + META + b"}",
        b"{" + ENTRY.replace(b"[0,4]}", b'[0,4],"x":1e400}') + b"," + META + b"}",
    ],
    ids=[
        "utf-16",
        "utf-32",
        "lone surrogate escape",
        "surrogate bytes",
        "duplicate field",
        "duplicate metadata",
        "NaN",
        "1e400",
    ],
)
def test_what_the_reference_refuses_we_refuse(header: bytes) -> None:
    assert _reference(_payload(header)) is None
    with pytest.raises(PayloadError):
        decode(_payload(header))


@pytest.mark.parametrize(
    "shape",
    [b"[-0]", b"[18446744073709551616,0]", b"[4294967296,4294967296,0]", b"[1.0]"],
)
def test_numbers_the_reference_refuses_in_a_shape_we_refuse(shape: bytes) -> None:
    header = b'{"w":{"dtype":"F32","shape":' + shape + b',"data_offsets":[0,0]},' + META + b"}"
    assert _reference(_payload(header, b"")) is None
    with pytest.raises(PayloadError):
        decode(_payload(header, b""))


def test_the_honest_payload_of_these_cases_is_accepted_by_both() -> None:
    data = _payload(b"{" + ENTRY + b"," + META + b"}")
    assert _reference(data) is not None and _ours(data) is not None
