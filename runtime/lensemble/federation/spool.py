"""The accepted updates of one round attempt, spilled to disk and read back at close.

The coordinator may reduce only when a round closes: the default norm bound is a multiple of
the round's *median* update norm, and the trimmed mean and median are coordinate-wise over all
updates. Holding every update in memory until then made the coordinator's memory grow with the
number of participants. Instead each accepted payload (the wire bytes, already hash-checked,
decoded and judged) is written once under ``<output_dir>/coordinator/spool/`` and only its hash,
its byte layout and its norm stay in memory. At close, :class:`SpooledUpdate` streams a payload
back in fixed-size blocks, dequantized (and clipped) straight into float32 blocks for the
reduction (:mod:`lensemble.federation.spool_reader`).

Where the file system allows it (Linux ``O_TMPFILE``: ext4, xfs, btrfs, tmpfs) a spilled
payload is an *unnamed* file: no path in the folder leads to it, only this process's
descriptor. That keeps it from whoever can list the folder, not from every other process of the
coordinator's user, which can open it through ``/proc/<pid>/fd``. Elsewhere (overlayfs, for
instance) the payload is a named ``0600`` file in a ``0700`` folder, which that user can
change too. So whatever the file, its bytes are hashed on receipt and verified on use: the
reader hashes exactly the bytes it hands to the reduction, and :meth:`SpooledUpdate.finish`
fails closed when they are not the ones accepted (a truncated, extended or modified file); the
reduction's result is discarded unless every update finished clean.

The spool is scratch, not part of the run record: it is not fsynced (a crash reopens the round
from the last checkpoint, whose updates are re-sent); unnamed files vanish with their
descriptor, and named ones are deleted when an attempt closes and when a coordinator starts.
Unnamed files are kept open from one attempt to the next and overwritten in place (then cut to
the new payload's length): a new file would have its pages allocated again every round, which
cost more than the write itself (docs/performance.md#block-sizes-and-buffers-of-the-hot-path).
Without an output folder, or when the folder has no room, the payload bytes are kept in memory
instead (same reader).

Small updates stay in memory: a payload of at most :data:`MEMORY_PAYLOAD_BYTES` is held as
bytes while the held payloads total at most :data:`MEMORY_BUDGET_BYTES`. Memory is not a file
another process of the user can rewrite, so such an update is hashed once, on receipt, and
never written, read back or hashed again; with a 1M-parameter model that was most of the
coordinator's CPU time per round (docs/performance.md#small-updates-held-in-memory). The
memory this costs is bounded by the budget, whatever the number of participants.

A transport that receives updates as streams (the network one) can also write each stream
straight into a spool file as it arrives (:meth:`UpdateSpool.land`), so that an update being
received or waiting for its verdict is not held in memory either: with N participants
uploading at once, the coordinator otherwise held N payloads. The coordinator judges a landed
payload from a private copy whose SHA-256 it checks against the one the stream had on receipt
(:class:`lensemble.federation.admission.Admission`), and, when it accepts it, the spool keeps
that file as the update's entry: nothing is written twice. Only an unnamed file lands a stream
(a named one would be in the folder, where whoever can list it sees the update arrive); where
none can be made, the stream is assembled in memory as before.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import weakref
from pathlib import Path

from lensemble.durable import DiskFull, check_free_space
from lensemble.federation.intake import Landing
from lensemble.federation.payload import Decoded
from lensemble.federation.spool_reader import SpooledUpdate, SpoolEntry

_log = logging.getLogger("lensemble.federation.spool")


#: Name of a spilled payload: acceptance order, so no sender text reaches a path.
_FILE = "update-{index:04d}.safetensors"

#: The largest payload (bytes) the spool holds in memory instead of a file: 8 MiB, a 2M-parameter
#: float32 update. Streams this small are also received in memory (:meth:`UpdateSpool.land`).
MEMORY_PAYLOAD_BYTES = 8 << 20

#: The most payload bytes the spool holds in memory at once (32 MiB); later ones spill.
MEMORY_BUDGET_BYTES = 32 << 20


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


def _private_folder(folder: Path) -> None:
    """Create ``folder`` with mode 0700, or make an existing one so.

    Raises:
        OSError: It cannot be made, or it is not a folder (a symbolic link, for instance).
    """
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    mode = os.lstat(folder).st_mode
    if not stat.S_ISDIR(mode):
        raise OSError(errno.ENOTDIR, "not a folder (a link?)", str(folder))
    if stat.S_IMODE(mode) != 0o700:
        os.chmod(folder, 0o700)


def _close_all(fds: list[int]) -> None:
    """Close and forget every descriptor in ``fds``."""
    while fds:
        os.close(fds.pop())


class UpdateSpool:
    """Accepted update payloads of the attempt being collected, by participant id.

    Args:
        folder: Where to spill payloads (created on first use), or None to keep them in memory.
        memory_budget: Payload bytes held in memory at most (bytes); a payload of at most
            :data:`MEMORY_PAYLOAD_BYTES` that fits is held, not spilled. 0 spills every one.
    """

    def __init__(self, folder: Path | None, memory_budget: int = MEMORY_BUDGET_BYTES) -> None:
        self.folder = folder
        self.memory_budget = memory_budget
        self._entries: dict[str, SpoolEntry] = {}
        self._count = 0
        self._held = 0  # payload bytes of the entries held in memory
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
        self._held = 0
        if self.folder is not None and self.folder.is_dir():
            try:
                for path in self.folder.glob("update-*.safetensors"):
                    path.unlink(missing_ok=True)
            except OSError as exc:  # out of descriptors, say: the next reset deletes them
                _log.warning("could not clear the spool folder %s (%s)", self.folder, exc)

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

    def _holds(self, size: int) -> bool:
        """Whether a payload of ``size`` bytes is held in memory rather than spilled now."""
        return size <= MEMORY_PAYLOAD_BYTES and self._held + size <= self.memory_budget

    def land(self, size: int) -> Landing | None:
        """A spool file for one incoming stream of ``size`` bytes, or None to use memory.

        Thread-safe. None when the spool would hold the payload in memory (see
        :data:`MEMORY_PAYLOAD_BYTES`; streams in flight are not counted against the budget, so
        at most one such stream per participant is in memory besides it), there is no folder,
        the file system cannot make unnamed files, or the folder has no room for ``size`` more
        bytes (a warning says so); the caller then assembles the stream in memory, as
        :meth:`add` then keeps it (or spills it, when the budget has filled meanwhile).

        Args:
            size: The stream's declared size (bytes), already checked against its cap.
        """
        if self.folder is None or size <= 0 or self._holds(size):
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
        """Keep ``pid``'s accepted payload: hold it when small, else spill it (or hold it).

        A payload that did not land is held in memory when it fits the budget (without a copy
        when it is ``bytes``), spilled otherwise, and held after all when spilling fails.

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
        elif self.folder is not None and not self._holds(len(view)):
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
            data = payload if type(payload) is bytes else bytes(view)
            self._held += len(view)
        self._entries[pid] = SpoolEntry(
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
        # 0600, created here (never a file or a link someone left in the folder).
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        named = os.open(path, flags, 0o600)
        try:
            written = 0
            while written < len(view):
                written += os.write(named, view[written:])
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(named)
        return path, None

    def _unnamed_for(self, size: int) -> int | None:
        """A kept unnamed file, or a new one, with room for ``size`` bytes; None: no O_TMPFILE.

        Raises:
            DiskFull: The folder lacks the room (a kept file is then closed).
            OSError: The folder or the file cannot be made.
        """
        assert self.folder is not None
        _private_folder(self.folder)
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
    ) -> SpooledUpdate:
        """Stream ``pid``'s update back as float32 blocks (see :class:`SpooledUpdate`).

        Raises:
            KeyError: ``pid`` has no entry.
            IntegrityError: Its unnamed file's length is no longer the payload's.
        """
        entry = self._entries[pid]
        return SpooledUpdate(pid, entry, scheme=scheme, chunk=chunk, block=block, factor=factor)
