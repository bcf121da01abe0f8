"""Bit-identical CPU computation regardless of how many intra-op threads torch would use.

Matrix products split their reductions across threads, and the split changes the order of
floating-point additions, so the same inputs can give different bits with a different thread
count. The coordinator hashes what participants return, so every inner step and every
evaluation runs single-threaded; for models this small that is also the fastest choice (see
``bench/world_model.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def single_threaded() -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(1)`` and restore the previous count after."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
