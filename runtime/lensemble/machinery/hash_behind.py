"""SHA-256 on a worker thread, beside the work that produces the bytes.

``hashlib`` releases the GIL while it hashes a buffer larger than 2 KiB, so a digest fed from
a second thread runs on another core while the caller computes or copies the next block. The
coordinator uses this twice: the spool re-hashes an update's blocks as it reads them back, and
the pre-commit check hands each tensor of the new global model to :class:`HashBehind` as
soon as it has checked it, so the model hash is computed beside the check and the outer step
instead of being one more pass after them (``bench/commit_tail.py`` measures both ways).
"""

from __future__ import annotations

import functools
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Protocol

import torch


class IncrementalDigest(Protocol):
    """A digest fed one named tensor at a time, in strictly increasing name order.

    :class:`lensemble.federation.payload.TensorDigest` (the model hash's byte stream) is one.
    """

    names: list[str]

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Hash one named tensor."""
        ...

    def hexdigest(self, suffix: bytes = b"") -> str:
        """The hex digest of everything added, with ``suffix`` bound after it."""
        ...


@functools.cache
def hashing_thread() -> ThreadPoolExecutor:
    """The process's one hashing thread (FIFO, so the blocks of each stream stay in order)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="lensemble-hash")


class HashBehind:
    """A tensor digest fed on :func:`hashing_thread`, one tensor at a time.

    Each :meth:`add` queues one tensor on :func:`hashing_thread` and returns; it first waits
    for the previous tensor to be hashed, so at most one tensor beyond the caller's current one
    is ever held. The result is bit-identical to feeding ``digest`` the same tensors directly
    (:func:`lensemble.federation.payload.model_hash_behind` builds the model hash's).

    Use it as a context manager: leaving the block waits for any hashing in flight and drops
    it, so a check that stops early (a non-finite tensor) leaves nothing running.

    Args:
        digest: A fresh incremental digest (nothing added yet).
        suffix: Bytes bound after the tensors when the digest is read (:meth:`result`).
    """

    def __init__(self, digest: IncrementalDigest, suffix: bytes = b"") -> None:
        self._digest = digest
        self._suffix = suffix
        self._pending: Future[None] | None = None

    def __enter__(self) -> HashBehind:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.exception()  # waits; an error matters only to result(), not here

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Queue one tensor (CPU, any supported dtype); names in strictly increasing order.

        The caller must not change ``tensor`` afterwards (it is read on the hashing thread).

        Raises:
            ValueError: Hashing the previous tensor failed because of its name's order.
            PayloadError: The previous tensor's dtype is not one Lensemble sends.
        """
        self._wait()
        self._pending = hashing_thread().submit(self._digest.add, name, tensor)

    def result(self, names: list[str]) -> str:
        """``"sha256:<64 hex>"`` once every tensor is hashed.

        Args:
            names: The names the hash must cover, sorted (the model's tensors).

        Raises:
            ValueError: The tensors handed over are not exactly ``names`` (a caller's bug),
                or hashing one of them failed as :meth:`add` describes.
        """
        self._wait()
        if self._digest.names != names:
            raise ValueError(
                f"the model hash covers {len(self._digest.names)} tensors, not the model's "
                f"{len(names)}."
            )
        return "sha256:" + self._digest.hexdigest(self._suffix)

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()
