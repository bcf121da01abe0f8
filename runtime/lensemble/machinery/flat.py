"""Named float32 tensors that are views into one contiguous buffer.

The coordinator holds the global model, the outer momentum and the reduction's accumulator
this way. One allocation instead of one per tensor: with the image's huge-page switch
(:mod:`lensemble.machinery.hugepages`) torch places a large allocation on 2 MiB pages, so
hashing and elementwise passes over the model stay off the TLB's critical path
(docs/performance.md, *Huge pages*), and small tensors, each under 2 MiB on its own, share huge
pages too. Each view is a tensor
like any other: per-tensor code (hashes, norms, payloads) is unchanged and sees the same
values, so every hash stays bit-identical.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

Params = dict[str, torch.Tensor]


def flat_empty(shapes: Mapping[str, torch.Size | tuple[int, ...]]) -> Params:
    """Uninitialised float32 tensors of ``shapes``, views into one buffer (sorted by name).

    Args:
        shapes: Name -> shape.

    Returns:
        Name -> contiguous float32 view of that shape.
    """
    names = sorted(shapes)
    sizes = [math.prod(shapes[name]) for name in names]
    buffer = torch.empty(sum(sizes), dtype=torch.float32)
    out: Params = {}
    offset = 0
    for name, size in zip(names, sizes, strict=True):
        out[name] = buffer[offset : offset + size].view(shapes[name])
        offset += size
    return out


def flat_copy(tensors: Mapping[str, torch.Tensor]) -> Params:
    """Float32 copies of ``tensors`` in one buffer (values converted as ``.to(float32)``).

    Args:
        tensors: Name -> CPU tensor of any float dtype and shape.

    Returns:
        Name -> contiguous float32 view holding a copy of that tensor.
    """
    out = flat_empty({name: tuple(t.shape) for name, t in tensors.items()})
    for name, view in out.items():
        view.copy_(tensors[name].detach())
    return out


def flat_zeros(shapes: Mapping[str, torch.Size | tuple[int, ...]]) -> Params:
    """Float32 zeros of ``shapes`` in one buffer (the initial outer momentum)."""
    out = flat_empty(shapes)
    for view in out.values():
        view.zero_()
    return out


def concatenated(tensors: Mapping[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """Every tensor in sorted name order, as one new 1-D vector of ``dtype`` (empty for none)."""
    if not tensors:
        return torch.zeros(0, dtype=dtype)
    return torch.cat([tensors[name].detach().reshape(-1).to(dtype) for name in sorted(tensors)])
