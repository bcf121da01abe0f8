"""Fixed point in Z_2^64: rounding, clipping counted, headroom refused by field, precision."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lensemble.errors import ConfigError
from lensemble.federation.secagg.fixed_point import WORD_LIMIT, FixedPoint, widest_bits


def encode(codec: FixedPoint, values: list[float]) -> np.ndarray:
    out = np.empty(len(values), dtype=np.uint64)
    codec.encode_into(np.asarray(values, dtype=np.float64), out)
    return out.view(np.int64)


def test_rounding_is_half_to_even() -> None:
    codec = FixedPoint(clip=100.0, fractional_bits=1)  # one unit is 0.5
    assert encode(codec, [0.25, 0.75, 1.25, -0.25, -0.75, 0.3]).tolist() == [0, 2, 2, 0, -2, 1]


def test_clipped_coordinates_are_counted_never_silent() -> None:
    codec = FixedPoint(clip=1.0, fractional_bits=4)
    out = np.empty(5, dtype=np.uint64)
    clipped = codec.encode_into(np.array([0.5, 1.0, 1.5, -3.0, -1.0], dtype=np.float32), out)
    assert clipped == 2  # exactly at the bound is not clipped
    assert out.view(np.int64).tolist() == [8, 16, 16, -16, -16]


def test_non_finite_values_are_refused_by_index() -> None:
    codec = FixedPoint(clip=1.0, fractional_bits=4)
    values = np.zeros(70_000, dtype=np.float32)
    values[66_000] = np.nan
    with pytest.raises(ValueError, match="coordinate 66000"):
        codec.encode_into(values, np.empty(len(values), dtype=np.uint64))


def test_an_encoding_that_could_overflow_names_the_config_fields() -> None:
    codec = FixedPoint(clip=1.0, fractional_bits=60)
    codec.check_headroom(4)
    with pytest.raises(ConfigError) as caught:
        codec.check_headroom(16)
    text = str(caught.value)
    assert "federation.masking.fractional_bits" in text
    assert "federation.masking.clip" in text
    assert f"at most {widest_bits(1.0, 16)}" in text


def test_invalid_parameters_name_their_field() -> None:
    with pytest.raises(ConfigError, match="federation.masking.clip"):
        FixedPoint(clip=0.0, fractional_bits=10)
    with pytest.raises(ConfigError, match="federation.masking.clip"):
        FixedPoint(clip=float("inf"), fractional_bits=10)
    with pytest.raises(ConfigError, match="federation.masking.fractional_bits"):
        FixedPoint(clip=1.0, fractional_bits=63)
    with pytest.raises(ConfigError, match="overflow"):
        FixedPoint.widest(2.0**62, 4)


@pytest.mark.parametrize(("clip", "n"), [(1.0, 3), (1.0, 1024), (0.05, 32), (1000.0, 17), (3.7, 5)])
def test_widest_uses_every_bit_of_headroom(clip: float, n: int) -> None:
    codec = FixedPoint.widest(clip, n)
    assert n * codec.bound <= WORD_LIMIT
    one_more = math.ceil(clip * 2.0 ** (codec.fractional_bits + 1))
    assert codec.fractional_bits == 62 or n * one_more > WORD_LIMIT


@settings(max_examples=30, deadline=None)
@given(n=st.integers(3, 64), seed=st.integers(0, 2**32))
def test_the_sum_of_n_clip_values_never_overflows(n: int, seed: int) -> None:
    codec = FixedPoint.widest(1.0, n)
    rng = np.random.default_rng(seed)
    signs = rng.choice([-1.0, 1.0])
    words = [encode(codec, [signs * 5.0]).view(np.uint64) for _ in range(n)]  # all clipped to ±clip
    total = np.zeros(1, dtype=np.uint64)
    for w in words:
        total += w
    assert codec.decode_sum(total)[0] == signs * n * 1.0


@pytest.mark.parametrize("scale", [1e-3, 1e-2, 1e-1])
@pytest.mark.parametrize("n", [4, 16, 32])
def test_the_decoded_mean_is_at_least_as_close_as_float32_averaging(scale: float, n: int) -> None:
    # The coordinator's plain mean sums float32 in canonical order and divides (diloco.py).
    d = 50_000
    rng = np.random.default_rng(n)
    updates = [(rng.standard_normal(d) * scale).astype(np.float32) for _ in range(n)]
    exact = np.mean(np.stack(updates).astype(np.float64), axis=0)
    float32_sum = np.zeros(d, dtype=np.float32)
    for u in updates:
        float32_sum += u
    float32_error = np.max(np.abs(float32_sum / np.float32(n) - exact))
    codec = FixedPoint.widest(1.0, n)
    total = np.zeros(d, dtype=np.uint64)
    for u in updates:
        words = np.empty(d, dtype=np.uint64)
        codec.encode_into(u, words)
        total += words
    fixed_error = np.max(np.abs(codec.decode_mean(total, n).astype(np.float64) - exact))
    assert fixed_error <= float32_error
