"""Bit-identical CPU computation regardless of how many intra-op threads torch would use.

Matrix products split their reductions across threads, and the split changes the order of
floating-point additions, so the same inputs can give different bits with a different thread
count. The coordinator hashes what participants return, so every inner step and every
evaluation runs single-threaded; for models this small that is also the fastest choice (see
``bench/world_model.py``).

torch's thread count is one setting for the whole process, and the in-process simulation trains
participants on several Python threads at once: the first block to enter sets one thread and the
last to leave restores the count, so no block ever runs with more than one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _ThreadCount:
    """torch's thread count while blocks run: how many are in, and the count to restore."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.previous = 1


_state = _ThreadCount()


@contextmanager
def single_threaded() -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(1)``; the count comes back after the last one.

    Safe to nest and to enter from several Python threads at once.
    """
    import torch

    with _state.lock:
        if _state.depth == 0:
            _state.previous = torch.get_num_threads()
        _state.depth += 1
        torch.set_num_threads(1)  # in this thread too: OpenMP keeps a count per thread
    try:
        yield
    finally:
        with _state.lock:
            _state.depth -= 1
            if _state.depth == 0:
                torch.set_num_threads(_state.previous)
