"""Bytes built in place: the same bytes as a join, and never handed out half written."""

from __future__ import annotations

import itertools
import os

import pytest

from lensemble.machinery.fresh_bytes import LARGE, BytesBuilder


@pytest.mark.parametrize("size", [0, 5, LARGE - 1, LARGE, LARGE + 4097])
def test_the_pieces_come_back_as_one_bytes_object(size: int) -> None:
    data = os.urandom(size)
    cuts = sorted({0, size, size // 3, size // 2, max(0, size - 1)})
    builder = BytesBuilder(size)
    for start, end in itertools.pairwise(cuts):
        builder.write(memoryview(data)[start:end])
    out = builder.finish()
    assert type(out) is bytes and out == data
    assert builder.size == builder.written == 0  # emptied: the object is not reachable from it


@pytest.mark.parametrize("size", [7, LARGE + 3])
def test_a_short_object_is_never_handed_out(size: int) -> None:
    builder = BytesBuilder(size)
    builder.write(b"\1" * (size - 1))
    with pytest.raises(ValueError, match=f"{size - 1} of {size} bytes"):
        builder.finish()


@pytest.mark.parametrize("size", [7, LARGE + 3])
def test_a_piece_that_does_not_fit_writes_nothing(size: int) -> None:
    builder = BytesBuilder(size)
    builder.write(b"\2" * (size - 2))
    with pytest.raises(ValueError, match="would not fit"):
        builder.write(b"\3" * 3)
    builder.write(b"\4\4")
    assert builder.finish() == b"\2" * (size - 2) + b"\4\4"


def test_a_negative_size_is_refused() -> None:
    with pytest.raises(ValueError, match="-1 bytes"):
        BytesBuilder(-1)


def _built(data: bytes) -> bytes:
    builder = BytesBuilder(len(data), recycle=True)
    builder.write(data)
    return builder.finish()


def test_a_released_object_is_written_over_and_reads_as_new() -> None:
    first_data, second_data = os.urandom(LARGE), os.urandom(LARGE)
    first = _built(first_data)
    hash(first)  # a cached hash must not survive the reuse
    first_id = id(first)
    del first
    second = _built(second_data)
    assert id(second) == first_id  # the same memory, not a fresh mapping
    assert second == second_data and hash(second) == hash(bytes(second_data))


@pytest.mark.parametrize("holder", ["name", "memoryview", "numpy", "torch"])
def test_an_object_still_held_is_never_written_over(holder: str) -> None:
    import numpy as np
    import torch

    first_data = os.urandom(LARGE)
    first = _built(first_data)
    views = {
        "name": lambda b: b,
        "memoryview": lambda b: memoryview(b)[8:],
        "numpy": lambda b: np.frombuffer(b, dtype=np.uint8)[8:],
        "torch": lambda b: torch.frombuffer(b, dtype=torch.uint8)[8:],
    }
    kept = views[holder](first)
    del first
    second = _built(os.urandom(LARGE))
    seen = kept if holder == "name" else bytes(kept)
    assert seen == (first_data if holder == "name" else first_data[8:])
    assert second is not kept
