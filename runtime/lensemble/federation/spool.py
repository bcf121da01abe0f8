"""The accepted updates of one round attempt, spilled to disk and read back at close.

The coordinator may reduce only when a round closes: the default norm bound is a multiple of
the round's *median* update norm, and the trimmed mean and median are coordinate-wise over all
updates. Holding every update in memory until then made the coordinator's memory grow with the
number of participants. Instead each accepted payload (the wire bytes, already hash-checked,
decoded and judged) is written once under ``<output_dir>/coordinator/spool/`` and only its hash,
its byte layout and its norm stay in memory. At close, :class:`SpooledUpdate` streams a payload
back in fixed-size blocks, dequantized (and clipped) straight into float32 blocks for the
reduction.

Where the file system allows it (Linux ``O_TMPFILE``: ext4, xfs, btrfs, tmpfs) a spilled
payload is an *unnamed* file: no path leads to it, only this process's descriptor, so no other
process can open or change it except through this process itself (``/proc/<pid>/fd``, which
needs the same rights as changing the process's memory). Its bytes are then as private as the
ones held in memory, and reading them back checks only their length. Elsewhere (overlayfs, for
instance) the payload is a named file in a ``0700`` folder, and the reader re-computes the
SHA-256 of every byte it reads: :meth:`SpooledUpdate.finish` fails closed when the bytes read
back are not exactly the ones accepted (a truncated, extended or modified file). Either way the
reduction's result is discarded unless every update finished clean.

The spool is scratch, not part of the run record: it is not fsynced (a crash reopens the round
from the last checkpoint, whose updates are re-sent); unnamed files vanish with their
descriptor, and named ones are deleted when an attempt closes and when a coordinator starts.
Unnamed files are kept open from one attempt to the next and overwritten in place (then cut to
the new payload's length): a new file would have its pages allocated again every round, which
cost more than the write itself (0.6 GB/s into fresh tmpfs pages on the development VM).
Without an output folder, or when the folder has no room, the payload bytes are kept in memory
instead (same reader).

A transport that receives updates as streams (the network one) can also write each stream
straight into a spool file as it arrives (:meth:`UpdateSpool.land`), so that an update being
received or waiting for its verdict is not held in memory either: with N participants
uploading at once, the coordinator otherwise held N payloads. The coordinator judges the
landed bytes through a read-only mapping and, when it accepts them, the spool keeps that file
as the update's entry: nothing is written twice. Only an unnamed file lands a stream (a
mapping of a named file could be cut short by someone else, a ``SIGBUS``); where none can be
made, the stream is assembled in memory as before.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import io
import logging
import mmap
import os
import threading
import warnings
import weakref
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch

from lensemble.durable import DiskFull, check_free_space
from lensemble.errors import IntegrityError
from lensemble.federation.intake import Landing
from lensemble.federation.payload import Decoded, TensorRange, dtype_token
from lensemble.federation.quantization import SCALE_SUFFIX, WIRE_DTYPES
from lensemble.machinery.hash_behind import hashing_thread

_log = logging.getLogger("lensemble.federation.spool")


#: Name of a spilled payload: acceptance order, so no sender text reaches a path.
_FILE = "update-{index:04d}.safetensors"


@dataclass(frozen=True)
class _Entry:
    digest: str
    size: int
    data_start: int
    layout: tuple[TensorRange, ...]
    path: Path | None  # a named file (re-hashed when read back)
    fd: int | None  # an unnamed file's descriptor (owned by the spool)
    data: bytes | None  # held in memory


def _unnamed_file(folder: Path) -> int | None:
    """A read-write descriptor of a new file in ``folder`` that has no name, or None.

    None when the platform or the file system cannot make one (no ``O_TMPFILE``; overlayfs).

    Raises:
        OSError: Any other failure (no room, no permission).
    """
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag:
        return None
    try:
        return os.open(folder, flag | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return None
        raise


def _close_all(fds: list[int]) -> None:
    """Close and forget every descriptor in ``fds``."""
    while fds:
        os.close(fds.pop())


#: Bytes of an unnamed spool file mapped at a time, shared by all the updates read together
#: (their windows are resident while mapped, so the budget keeps that independent of N).
WINDOW_BUDGET = 64 << 20
_PAGE = mmap.ALLOCATIONGRANULARITY


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
    """Consecutive read-only views of a payload, without copying it.

    In-memory bytes are sliced; an unnamed file is mapped (read-only, shared, populated at
    once) one window at a time, so its bytes are read straight from the page cache. Only an
    unnamed file is ever mapped: nobody else can shorten it (see the module docstring), which a
    mapping would otherwise turn into a ``SIGBUS``. A view stays valid as long as it is
    referenced (its mapping goes with the last view).

    Args:
        data: The payload in memory, or None for ``fd``.
        fd: The unnamed file's descriptor, or None for ``data``.
        size: Bytes of the payload (the file's length was checked against it).
        window: Bytes to map at a time (a take larger than that maps what it needs).
    """

    def __init__(self, data: bytes | None, fd: int | None, size: int, window: int) -> None:
        self._data = memoryview(data).cast("B") if data is not None else None
        self._fd = fd
        self._size = size
        self._window = max(_PAGE, window - window % _PAGE)
        self._at = 0
        self._map_start = self._map_end = 0
        self._mapped: memoryview | None = None

    def take(self, n: int) -> memoryview | None:
        """The next ``n`` bytes, or None when fewer are left."""
        start, end = self._at, self._at + n
        if end > self._size:
            return None
        self._at = end
        if self._data is not None:
            return self._data[start:end]
        if self._mapped is None or end > self._map_end:
            assert self._fd is not None
            self._map_start = start - start % _PAGE
            self._map_end = min(self._size, max(self._map_start + self._window, end))
            mapping = mmap.mmap(
                self._fd,
                self._map_end - self._map_start,
                flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                prot=mmap.PROT_READ,
                offset=self._map_start,
            )
            self._mapped = memoryview(mapping)  # the mapping goes with its last view
        return self._mapped[start - self._map_start : end - self._map_start]

    def left(self) -> int:
        """Bytes not taken yet."""
        return self._size - self._at


class UpdateSpool:
    """Accepted update payloads of the attempt being collected, by participant id.

    Args:
        folder: Where to spill payloads (created on first use), or None to keep them in memory.
    """

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self._entries: dict[str, _Entry] = {}
        self._count = 0
        # Unnamed files of earlier attempts, open and ready to be overwritten; closed by close()
        # or when the spool is garbage. Streams land from the transport's threads: the lock
        # guards the list (and _closed) against the coordinator's own thread.
        self._free: list[int] = []
        self._lock = threading.Lock()
        self._closed = False
        weakref.finalize(self, _close_all, self._free)

    def __contains__(self, pid: object) -> bool:
        return pid in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def reset(self) -> None:
        """Forget every entry, keep its unnamed file for the next attempt, delete named files.

        Named leftovers of a crash are deleted too. A kept file's bytes are overwritten before
        it is read again.
        """
        with self._lock:
            for entry in self._entries.values():
                if entry.fd is not None:
                    self._free.append(entry.fd)
        self._entries.clear()
        self._count = 0
        if self.folder is not None and self.folder.is_dir():
            for path in self.folder.glob("update-*.safetensors"):
                path.unlink(missing_ok=True)

    def close(self) -> None:
        """Forget every entry and close every unnamed file, kept ones included (idempotent).

        A stream still landing keeps its file until it is dropped, and then closes it.
        """
        self.reset()
        with self._lock:
            self._closed = True
            _close_all(self._free)

    def _take_free(self) -> int | None:
        with self._lock:
            return self._free.pop() if self._free else None

    def _give_back(self, fd: int) -> None:
        """Keep a landed file nobody adopted for the next stream or spill (or close it)."""
        with self._lock:
            if not self._closed:
                self._free.append(fd)
                return
        os.close(fd)

    def land(self, size: int) -> Landing | None:
        """A spool file for one incoming stream of ``size`` bytes, or None to use memory.

        Thread-safe. None when there is no folder, the file system cannot make unnamed files,
        or the folder has no room for ``size`` more bytes (a warning says so); the caller then
        assembles the stream in memory, as :meth:`add` then keeps it.

        Args:
            size: The stream's declared size (bytes), already checked against its cap.
        """
        if self.folder is None or size <= 0:
            return None
        fd = None
        try:
            fd = self._unnamed_for(size)
        except (DiskFull, OSError) as exc:
            _log.warning(
                "could not land an incoming update of %d bytes in %s (%s); holding it in memory",
                size,
                self.folder,
                getattr(exc, "message", None) or exc,
            )
            return None
        return None if fd is None else Landing(fd, size, self._give_back)

    def add(
        self,
        pid: str,
        payload: bytes | bytearray | memoryview,
        digest: str,
        decoded: Decoded,
        landed: Landing | None = None,
    ) -> None:
        """Keep ``pid``'s accepted payload: spill it, or hold its bytes when there is no room.

        Args:
            pid: The contributor.
            payload: The payload bytes exactly as accepted.
            digest: Their ``sha256:<hex>``, as the coordinator checked it (not recomputed).
            decoded: :func:`~lensemble.federation.payload.decode` of ``payload`` (its layout is
                what the reader trusts; the bytes themselves are re-checked).
            landed: The spool file ``payload`` was received into (:meth:`land`), which then
                becomes the entry as it is, without another write.
        """
        view = memoryview(payload).cast("B")
        path = fd = None
        data = None
        if landed is not None:
            fd = landed.adopt()
        elif self.folder is not None:
            try:
                path, fd = self._spill(view)
            except (DiskFull, OSError) as exc:
                _log.warning(
                    "could not spill %s's update to %s (%s); holding it in memory",
                    pid,
                    self.folder,
                    getattr(exc, "message", None) or exc,
                )
        if path is None and fd is None:
            data = bytes(view)
        self._entries[pid] = _Entry(
            digest.removeprefix("sha256:"),
            len(view),
            decoded.data_start,
            decoded.layout,
            path,
            fd,
            data,
        )

    def _spill(self, view: memoryview) -> tuple[Path | None, int | None]:
        """Write ``view`` to a new spool file.

        Returns ``(None, fd)`` for an unnamed file, else ``(path, None)`` for a named one.
        """
        assert self.folder is not None
        fd = self._unnamed_for(len(view))
        if fd is not None:
            try:
                written = 0
                while written < len(view):
                    written += os.pwrite(fd, view[written:], written)
                os.ftruncate(fd, len(view))  # a reused file may have been longer
            except BaseException:
                os.close(fd)
                raise
            return None, fd
        path = self.folder / _FILE.format(index=self._count)
        self._count += 1
        try:
            with open(path, "xb", buffering=0) as f:
                written = 0
                while written < len(view):
                    written += f.write(view[written:])
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return path, None

    def _unnamed_for(self, size: int) -> int | None:
        """A kept unnamed file, or a new one, with room for ``size`` bytes; None: no O_TMPFILE.

        Raises:
            DiskFull: The folder lacks the room (a kept file is then closed).
            OSError: The folder or the file cannot be made.
        """
        assert self.folder is not None
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = self._take_free()
        if fd is None:
            check_free_space(self.folder, size)
            return _unnamed_file(self.folder)
        self._check_growth(fd, size)  # a kept file needs room only for what the payload adds
        return fd

    def _check_growth(self, fd: int, size: int) -> None:
        """Refuse (closing ``fd``) when the folder lacks room to grow ``fd`` to ``size`` bytes.

        Raises:
            DiskFull: Not enough free space.
        """
        assert self.folder is not None
        try:
            grow = size - os.fstat(fd).st_size
            if grow > 0:
                check_free_space(self.folder, grow)
        except BaseException:
            os.close(fd)
            raise

    def reader(
        self,
        pid: str,
        *,
        scheme: str,
        chunk: int,
        block: int,
        factor: float | None = None,
        window: int = WINDOW_BUDGET,
    ) -> SpooledUpdate:
        """Stream ``pid``'s update back as float32 blocks (see :class:`SpooledUpdate`).

        Raises:
            KeyError: ``pid`` has no entry.
            IntegrityError: Its unnamed file's length is no longer the payload's.
        """
        entry = self._entries[pid]
        return SpooledUpdate(
            pid, entry, scheme=scheme, chunk=chunk, block=block, factor=factor, window=window
        )


class SpooledUpdate:
    """One spilled update read back once, front to back (a named file's SHA-256 re-computed).

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
        window: Bytes of an unnamed file mapped at a time (:class:`_Views`).

    Raises:
        IntegrityError: The unnamed file's length is no longer the payload's, or a named file
            cannot be opened.
    """

    def __init__(
        self,
        pid: str,
        entry: _Entry,
        *,
        scheme: str,
        chunk: int,
        block: int,
        factor: float | None,
        window: int = WINDOW_BUDGET,
    ) -> None:
        self.pid = pid
        self._entry = entry
        self._scheme = scheme
        self._chunk = chunk
        self._block = block
        self._factor = factor
        # Only a named file can have been changed by anyone else (see the module docstring).
        self._hash = hashlib.sha256() if entry.path is not None else None
        self._read = 0
        # Bytes in memory and unnamed files are read as views, without a copy; a named file,
        # which anyone with access to the folder could change or shorten, is read into
        # buffers and hashed.
        self._views: _Views | None = None
        self._source: io.RawIOBase | None = None
        if entry.fd is not None:
            length = os.fstat(entry.fd).st_size
            if length != entry.size:
                raise self._broken(f"it is {length} bytes long, not {entry.size}")
            self._views = _Views(None, entry.fd, entry.size, window)
        elif entry.path is not None:
            try:
                self._source = open(entry.path, "rb", buffering=0)  # noqa: SIM115 (closed in finish)
            except OSError as exc:
                raise self._broken(f"it cannot be read ({exc.strerror})") from None
        else:
            assert entry.data is not None
            self._views = _Views(entry.data, None, entry.size, window)
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

        A read-only view of the payload itself, or (named file) of a reusable buffer that is
        valid until the next call.
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
