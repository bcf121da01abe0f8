"""Wire formats: error bounds, exact byte counts, determinism, round-half-to-even."""

from __future__ import annotations

import pytest
import torch

from lensemble.errors import ArchitectureMismatch, PayloadError
from lensemble.federation.payload import encode, manifest
from lensemble.federation.quantization import (
    SCALE_SUFFIX,
    dequantize,
    quantize,
    wire_bytes,
    wire_specs,
)


def _delta(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "enc.w": torch.randn(64, 33, generator=g) * 0.01,
        "enc.b": torch.randn(33, generator=g) * 3.0,
        "pred.w": torch.zeros(5, 5),
    }


@pytest.mark.parametrize("chunk", [0, 100, 1000])
def test_int8_error_is_at_most_half_a_step(chunk: int) -> None:
    delta = _delta()
    arch = manifest(delta)
    wire = quantize(delta, "int8", chunk)
    back = dequantize(wire, arch, "int8", chunk)
    for name, x in delta.items():
        scale = wire[name + SCALE_SUFFIX]
        size = x.numel() if scale.numel() == 1 else chunk
        per_element = scale.repeat_interleave(size)[: x.numel()].reshape(x.shape)
        err = (back[name] - x).abs()
        assert bool((err <= per_element / 2 * (1 + 1e-6)).all()), name
        # Each scale is max|x| / 127 of its chunk, so the worst case is max|x| / 254.
        assert float(err.max()) <= float(x.abs().max()) / 254 * (1 + 1e-6) + 1e-12


def test_int8_rounds_half_to_even() -> None:
    x = {"v": torch.tensor([127.0, 0.5, 1.5, 2.5, -0.5, -2.5])}
    codes = quantize(x, "int8")["v"]
    assert codes.tolist() == [127, 0, 2, 2, 0, -2]


@pytest.mark.parametrize(
    ("scheme", "rel", "tiny"),
    [("fp16", 2**-11, 2**-25), ("bf16", 2**-8, 0.0)],  # fp16 subnormals step by 2^-24
)
def test_half_precision_relative_error(scheme: str, rel: float, tiny: float) -> None:
    delta = _delta()
    back = dequantize(quantize(delta, scheme), manifest(delta), scheme)
    for name, x in delta.items():
        assert bool(((back[name] - x).abs() <= x.abs() * rel + tiny).all())


def test_none_is_lossless_and_everything_is_deterministic() -> None:
    delta = _delta()
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            dequantize(quantize(delta, "none"), manifest(delta), "none").values(),
            [delta[k] for k in manifest(delta)],
            strict=True,
        )
    )
    for scheme in ("none", "fp16", "bf16", "int8"):
        assert encode(quantize(delta, scheme), {}) == encode(quantize(_delta(), scheme), {})


def test_exact_byte_counts_and_int8_ratio() -> None:
    delta = {"w": torch.randn(256, 256), "b": torch.randn(256)}
    arch = manifest(delta)
    numel = 256 * 256 + 256
    assert wire_bytes(arch, "none") == 4 * numel
    assert wire_bytes(arch, "fp16") == wire_bytes(arch, "bf16") == 2 * numel
    assert wire_bytes(arch, "int8") == numel + 4 * 2  # one float32 scale per tensor
    assert wire_bytes(arch, "int8", chunk=1024) == numel + 4 * (64 + 1)
    # The real serialized payload is the tensor bytes plus a small safetensors header.
    for scheme in ("none", "int8"):
        payload = encode(quantize(delta, scheme), {})
        header = int.from_bytes(payload[:8], "little")
        assert len(payload) == 8 + header + wire_bytes(arch, scheme)
    ratio = len(encode(quantize(delta, "int8"), {})) / len(encode(quantize(delta, "none"), {}))
    assert 0.25 < ratio < 0.26


def test_non_finite_and_overflow_are_refused() -> None:
    with pytest.raises(PayloadError, match="NaN or Inf"):
        quantize({"w": torch.tensor([1.0, float("nan")])}, "int8")
    with pytest.raises(PayloadError, match="overflows fp16"):
        quantize({"w": torch.tensor([1e6])}, "fp16")


def test_dequantize_checks_architecture_and_scales() -> None:
    delta = _delta()
    arch = manifest(delta)
    wire = quantize(delta, "int8")
    wrong = dict(wire)
    wrong["enc.b"] = wire["enc.b"][:-1]
    with pytest.raises(ArchitectureMismatch, match="enc.b"):
        dequantize(wrong, arch, "int8")
    zero_scale = dict(wire)
    zero_scale["enc.b" + SCALE_SUFFIX] = torch.zeros(1)
    with pytest.raises(PayloadError, match="scales"):
        dequantize(zero_scale, arch, "int8")
    assert set(wire_specs(arch, "int8")) == set(wire)
