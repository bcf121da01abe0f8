"""Reading a spilled update back: float32 blocks for the reduction, its bytes checked.

:class:`SpooledUpdate` streams one accepted payload of the spool
(:mod:`lensemble.federation.spool`) front to back in fixed-size blocks, dequantized (and
clipped) straight into float32 blocks. Bytes held in memory are read as views, without a copy:
nobody else can change them. A spilled file, named or unnamed, can be: a named one by anyone
with access to the folder, an unnamed one by any process of the coordinator's user through
``/proc/<pid>/fd``. So a file is read into the reader's own buffers, the reduction uses those
very bytes, and their SHA-256 is computed as they are read (on the hashing thread, beside the
reduction); :meth:`SpooledUpdate.finish` fails closed when the bytes read back are not exactly
the ones accepted, and the reduction's result is then discarded.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import warnings
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lensemble.errors import IntegrityError
from lensemble.federation.payload import TensorRange, dtype_token
from lensemble.federation.quantization import SCALE_SUFFIX, WIRE_DTYPES
from lensemble.machinery.hash_behind import hashing_thread


@dataclass(frozen=True)
class SpoolEntry:
    """Where an accepted update waits, and what reading it back checks."""

    digest: str
    size: int
    data_start: int
    layout: tuple[TensorRange, ...]
    path: Path | None  # a named file (re-hashed when read back)
    fd: int | None  # an unnamed file's descriptor (owned by the spool; re-hashed too)
    data: bytes | None  # held in memory


@functools.cache
def _quiet_read_only_buffers() -> None:
    """Let torch give its one-time warning about read-only buffers here, and silence it.

    Blocks read from the spool are views of bytes nothing may write (a payload in memory or a
    read-only mapping), and the reduction only reads them; torch warns once per process that
    such a tensor would let a caller write to them.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.frombuffer(b"\0\0\0\0", dtype=torch.float32)


def _tensor(view: memoryview, dtype: torch.dtype) -> torch.Tensor:
    """A tensor over ``view`` without a copy (read-only when the view is)."""
    if view.readonly:
        _quiet_read_only_buffers()
    return torch.frombuffer(view, dtype=dtype)


class _Views:
    """Consecutive read-only views of a payload held in memory, without copying it.

    Args:
        data: The payload.
    """

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data).cast("B")
        self._at = 0

    def take(self, n: int) -> memoryview | None:
        """The next ``n`` bytes, or None when fewer are left."""
        start, end = self._at, self._at + n
        if end > len(self._data):
            return None
        self._at = end
        return self._data[start:end]

    def left(self) -> int:
        """Bytes not taken yet."""
        return len(self._data) - self._at


class _Unnamed(io.RawIOBase):
    """An unnamed spool file read front to back with ``pread`` (its descriptor stays open).

    Positional reads leave the descriptor's own offset alone: the spool writes the next
    attempt's payload into the same file with ``pwrite``.
    """

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd
        self._at = 0

    def readable(self) -> bool:
        """Always."""
        return True

    def readinto(self, buffer: Any) -> int:
        """Read into ``buffer`` from where the last read ended; 0 at the end of the file."""
        n = os.preadv(self._fd, [buffer], self._at)
        self._at += n
        return n


class SpooledUpdate:
    """One spilled update read back once, front to back (a file's SHA-256 re-computed).

    Blocks come in the payload's file order (the same for every update of a round: tensors
    ordered by dtype then name); each parameter tensor is cut into blocks of ``block``
    elements starting at its element 0. Wire values are decoded exactly as
    :func:`~lensemble.federation.quantization.dequantize` does (fp16/bf16 cast to float32; int8
    codes times their chunk's scale), then a clipped update is scaled exactly as
    :func:`~lensemble.federation.robustness.screen` does (float64 multiply, one rounding to
    float32), so a reduction over these blocks is bit-identical to one over whole tensors.

    Args:
        pid: The contributor (for error messages).
        entry: Its spool entry.
        scheme: ``federation.quantization``.
        chunk: ``federation.int8_chunk``.
        block: Elements per block.
        factor: The clipping factor, or None when the update is used as sent.

    Raises:
        IntegrityError: The unnamed file's length is no longer the payload's, or a named file
            cannot be opened.
    """

    def __init__(
        self,
        pid: str,
        entry: SpoolEntry,
        *,
        scheme: str,
        chunk: int,
        block: int,
        factor: float | None,
    ) -> None:
        self.pid = pid
        self._entry = entry
        self._scheme = scheme
        self._chunk = chunk
        self._block = block
        self._factor = factor
        # Bytes in memory are read as views, without a copy: nobody else can change them. A
        # file, which another process could change or shorten (see the module docstring), is
        # read into buffers, and exactly those bytes are hashed and reduced.
        self._hash = hashlib.sha256() if entry.data is None else None
        self._read = 0
        self._views: _Views | None = None
        self._source: io.RawIOBase | None = None
        if entry.fd is not None:
            length = os.fstat(entry.fd).st_size
            if length != entry.size:
                raise self._broken(f"it is {length} bytes long, not {entry.size}")
            self._source = _Unnamed(entry.fd)
        elif entry.path is not None:
            try:
                self._source = open(entry.path, "rb", buffering=0)  # noqa: SIM115 (closed in finish)
            except OSError as exc:
                raise self._broken(f"it cannot be read ({exc.strerror})") from None
        else:
            assert entry.data is not None
            self._views = _Views(entry.data)
        # Two buffers in turn: SHA-256 of one block runs on the hashing thread while the next
        # block is read and reduced (hashlib releases the GIL), in the order the bytes came.
        self._buffers = [bytearray(0), bytearray(0)]
        self._pending: list[Future[None] | None] = [None, None]
        self._turn = 0

    def _where(self) -> str:
        if self._entry.path is not None:
            return str(self._entry.path)
        return "an unnamed file" if self._entry.fd is not None else "memory"

    def _broken(self, what: str) -> IntegrityError:
        return IntegrityError(
            f"the spooled update of '{self.pid}' ({self._where()}) changed after it was "
            f"accepted: {what};",
            remediation="something else writes the coordinator's state folder; stop it and "
            "resume the run (the round is redone from the last checkpoint).",
        )

    def _take(self, n: int) -> memoryview:
        """The next ``n`` bytes, as a view.

        A read-only view of the payload itself (in memory), or (a file) of a reusable buffer
        that is valid until the next call.
        """
        if self._views is not None:
            view = self._views.take(n)
            if view is None:
                raise self._broken(
                    f"it ends after {self._read + self._views.left()} bytes, not "
                    f"{self._read + n} or more"
                )
            self._read += n
            return view
        assert self._source is not None
        turn = self._turn
        self._turn ^= 1
        self._wait(turn)  # its previous block is hashed before it is overwritten
        if n > len(self._buffers[turn]):
            self._buffers[turn] = bytearray(n)
        view = memoryview(self._buffers[turn])[:n]
        got = 0
        while got < n:
            k = self._source.readinto(view[got:])
            if not k:
                raise self._broken(
                    f"it ends after {self._read + got} bytes, not {self._entry.size}"
                )
            got += k
        if self._hash is not None:
            self._pending[turn] = hashing_thread().submit(self._hash.update, view)
        self._read += n
        return view

    def _wait(self, turn: int) -> None:
        pending = self._pending[turn]
        if pending is not None:
            pending.result()
            self._pending[turn] = None

    def blocks(self) -> Iterator[tuple[str, int, torch.Tensor]]:
        """Yield ``(tensor name, first element, float32 block)`` for every parameter tensor.

        A block is only valid until the next one is requested. Scale tensors (int8) are read
        as they come (before the codes they scale) and not yielded.

        Raises:
            IntegrityError: The file is shorter than the accepted payload.
        """
        self._take(self._entry.data_start)  # the header: hashed, its parsed layout is trusted
        scales: dict[str, torch.Tensor] = {}
        wire = WIRE_DTYPES[self._scheme]
        item = torch.empty((), dtype=wire).element_size()
        for entry in self._entry.layout:
            if entry.name.endswith(SCALE_SUFFIX):
                raw = self._take(entry.end - entry.begin)
                scales[entry.name[: -len(SCALE_SUFFIX)]] = (
                    torch.frombuffer(bytearray(raw), dtype=torch.float32)
                    if len(raw)
                    else torch.empty(0)
                )
                continue
            assert entry.dtype == dtype_token(wire)  # the layout was checked at acceptance
            numel = (entry.end - entry.begin) // item
            scale = scales.get(entry.name)
            per = numel if self._chunk <= 0 or scale is None or scale.numel() == 1 else self._chunk
            for start in range(0, numel, self._block):
                n = min(self._block, numel - start)
                raw = self._take(n * item)
                values = _tensor(raw, wire).to(torch.float32)
                if self._scheme == "int8":
                    assert scale is not None
                    index = torch.arange(start, start + n) // per
                    values = values * scale[index]
                if self._factor is not None:
                    values = (values.double() * self._factor).to(torch.float32)
                yield entry.name, start, values

    def close(self) -> None:
        """Close the source without checking it (after an error elsewhere; idempotent)."""
        for turn in (0, 1):
            pending, self._pending[turn] = self._pending[turn], None
            if pending is not None:
                pending.exception()  # a buffer is not dropped while the hashing thread reads it
        if self._source is not None:
            self._source.close()
        self._views = None

    def finish(self) -> None:
        """Check that exactly the accepted bytes were read, then close the source.

        Raises:
            IntegrityError: Bytes were left over, the file is longer than the payload, or the
                SHA-256 of what was read differs from the accepted payload's.
        """
        try:
            self._wait(0)
            self._wait(1)
            if self._read != self._entry.size:
                raise self._broken(
                    f"{self._read} of its {self._entry.size} bytes were read (layout changed)"
                )
            if self._source is not None and self._source.read(1):
                raise self._broken(f"it is longer than the {self._entry.size} bytes accepted")
            if self._entry.fd is not None:
                length = os.fstat(self._entry.fd).st_size
                if length != self._entry.size:
                    raise self._broken(f"it is {length} bytes long now, not {self._entry.size}")
            if self._hash is not None and self._hash.hexdigest() != self._entry.digest:
                raise self._broken("its SHA-256 differs from the accepted payload's")
        finally:
            self.close()
