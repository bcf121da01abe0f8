"""Wire formats of pseudo-gradients: float32, float16, bfloat16 or int8 with scales.

``int8`` is symmetric linear quantization: for each tensor (or each chunk of ``int8_chunk``
elements of the flattened tensor) the scale is ``s = max|x| / 127`` (``s = 1`` for an all-zero
chunk), the codes are ``clamp(round(x / s), -127, 127)`` with round-half-to-even
(``torch.round``), and decoding is ``codes * s``. Each element is off by at most ``s / 2``; the
wire carries one int8 per element plus one float32 scale per chunk, close to 1/4 of float32.
``fp16``/``bf16`` are IEEE casts (round to nearest even). All of it is deterministic.

Upstream Lensemble defines the same per-tensor int8 scheme; per-chunk scales and the
half-precision formats are ours. Where the wire format fits in a round: docs/concepts.md#diloco.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from lensemble.errors import PayloadError, ScaleOutOfRange
from lensemble.federation.payload import TensorSpec, check_architecture

SCALE_SUFFIX = "::scale"
WIRE_DTYPES: dict[str, torch.dtype] = {
    "none": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "int8": torch.int8,
}


def all_finite(x: torch.Tensor) -> bool:
    """True when no element is NaN or Inf.

    Fast path: a finite sum implies finite elements (NaN and Inf propagate through addition);
    only a non-finite sum (a bad element, or an overflowing sum) needs the elementwise check.
    """
    if x.numel() == 0 or bool(torch.isfinite(x.sum())):
        return True
    return bool(torch.isfinite(x).all())


def _chunks(numel: int, chunk: int) -> int:
    return 1 if chunk <= 0 or numel == 0 else -(-numel // chunk)


def wire_specs(
    model: Mapping[str, TensorSpec], scheme: str, chunk: int = 0
) -> dict[str, TensorSpec]:
    """Exactly the tensors (names, shapes, dtypes) a pseudo-gradient payload may carry.

    This is both what the residency guard lets out of a participant and what the coordinator
    accepts: the model's parameters in the wire dtype, plus one float32 scale vector per
    parameter for int8.
    """
    dtype = WIRE_DTYPES[scheme]
    specs: dict[str, TensorSpec] = {}
    for name, spec in model.items():
        specs[name] = TensorSpec(name, spec.shape, dtype)
        if scheme == "int8":
            numel = 1
            for d in spec.shape:
                numel *= d
            scale = name + SCALE_SUFFIX
            specs[scale] = TensorSpec(scale, (_chunks(numel, chunk),), torch.float32)
    return specs


def _int8(x: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    flat = x.reshape(-1)
    n = _chunks(flat.numel(), chunk)
    size = flat.numel() if n == 1 else chunk
    padded = torch.zeros(n * size, dtype=torch.float32)
    padded[: flat.numel()] = flat
    blocks = padded.reshape(n, size)
    scale = blocks.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.clamp(torch.round(blocks / scale[:, None]), -127, 127).to(torch.int8)
    return codes.reshape(-1)[: flat.numel()].reshape(x.shape), scale


def quantize(
    delta: Mapping[str, torch.Tensor], scheme: str, chunk: int = 0
) -> dict[str, torch.Tensor]:
    """Encode a float32 pseudo-gradient for the wire.

    Args:
        delta: Name -> float32 tensor.
        scheme: ``none``, ``fp16``, ``bf16`` or ``int8``.
        chunk: Elements per int8 scale; 0 means one scale per tensor.

    Returns:
        Wire tensors, exactly :func:`wire_specs` of the delta's architecture.

    Raises:
        PayloadError: A value is not finite, or overflows float16.
    """
    out: dict[str, torch.Tensor] = {}
    for name, value in delta.items():
        x = value.detach().to(torch.float32)
        if not all_finite(x):
            raise PayloadError(f"pseudo-gradient tensor '{name}' has NaN or Inf values.")
        if scheme == "none":
            out[name] = x
        elif scheme in ("fp16", "bf16"):
            y = x.to(WIRE_DTYPES[scheme])
            if not bool(torch.isfinite(y).all()):
                raise PayloadError(
                    f"pseudo-gradient tensor '{name}' overflows {scheme};",
                    remediation="use federation.quantization: bf16 or int8.",
                )
            out[name] = y
        elif scheme == "int8":
            out[name], out[name + SCALE_SUFFIX] = _int8(x, chunk)
        else:
            raise ValueError(f"unknown quantization {scheme!r}")
    return out


def dequantize(
    wire: Mapping[str, torch.Tensor],
    model: Mapping[str, TensorSpec],
    scheme: str,
    chunk: int = 0,
    *,
    max_scale: float = math.inf,
) -> dict[str, torch.Tensor]:
    """Decode wire tensors back to a float32 pseudo-gradient, checking the architecture.

    Args:
        wire: Name -> wire tensor, as :func:`quantize` returns.
        model: The global model's tensor specs.
        scheme: ``none``, ``fp16``, ``bf16`` or ``int8``.
        chunk: Elements per int8 scale; 0 means one scale per tensor.
        max_scale: Largest int8 scale accepted (``federation.robustness.max_int8_scale``).

    Raises:
        ArchitectureMismatch: Names, shapes or dtypes differ from ``wire_specs``.
        ScaleOutOfRange: An int8 scale exceeds ``max_scale``.
        PayloadError: A scale or value is not finite, or a scale is not positive.
    """
    check_architecture(wire, wire_specs(model, scheme, chunk), what="the pseudo-gradient")
    out: dict[str, torch.Tensor] = {}
    for name, spec in model.items():
        x = wire[name]
        if scheme == "int8":
            scale = wire[name + SCALE_SUFFIX]
            if not bool(torch.isfinite(scale).all()) or not bool((scale > 0).all()):
                raise PayloadError(f"int8 scales of '{name}' are not finite positive numbers.")
            if bool((scale > max_scale).any()):
                raise ScaleOutOfRange(
                    f"an int8 scale of '{name}' is {float(scale.max()):.3g}, above "
                    f"federation.robustness.max_int8_scale ({max_scale:g})."
                )
            flat = x.reshape(-1).to(torch.float32)
            n = scale.numel()
            size = flat.numel() if n == 1 else chunk
            per_element = scale.repeat_interleave(size)[: flat.numel()]
            out[name] = (flat * per_element).reshape(spec.shape)
        else:
            out[name] = x.to(torch.float32)
        if not all_finite(out[name]):
            raise PayloadError(f"pseudo-gradient tensor '{name}' has NaN or Inf values.")
    return out


def wire_bytes(model: Mapping[str, TensorSpec], scheme: str, chunk: int = 0) -> int:
    """Tensor bytes of one pseudo-gradient on the wire (excluding the safetensors header)."""
    total = 0
    for spec in wire_specs(model, scheme, chunk).values():
        numel = 1
        for d in spec.shape:
            numel *= d
        total += numel * torch.empty((), dtype=spec.dtype).element_size()
    return total
