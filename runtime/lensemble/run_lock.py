"""One run per folder: an exclusive ``flock`` held for a run's life.

``RunLock(folder / "run.lock")`` is taken by the command that owns a run folder (``lensemble
simulate``), and ``coordinator/lock`` by the process that writes the coordinator's checkpoints
and ledger. The kernel drops a ``flock`` when its holder dies, so a crashed run never leaves a
stale lock; the file records the holder's pid only to name it in the error.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from lensemble.errors import UsageError


class FolderLocked(UsageError):
    """Another live process holds the run folder's lock (exit 2)."""

    code = "folder_locked"


class RunLock:
    """An exclusive, non-blocking lock on a file, held until :meth:`release` or process exit.

    Args:
        path: The lock file (created with its folder).
        what: What the lock protects, for the error (e.g. ``the run folder runs/local``).

    Raises (from :meth:`acquire`):
        FolderLocked: Another process holds it; the message names its pid.
    """

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock at once or raise :class:`FolderLocked`."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise FolderLocked(
                f"{self.what} is in use by another run (pid {holder}, lock {self.path});",
                remediation="wait for it to finish or stop it, or use another output folder.",
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock (the file stays; an empty pid means nobody holds it)."""
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def run_folder_lock(output_dir: Path) -> RunLock:
    """The lock of the command that owns ``output_dir`` (``<output_dir>/run.lock``)."""
    return RunLock(output_dir / "run.lock", f"the run folder {output_dir}")


def coordinator_lock(output_dir: Path) -> RunLock:
    """The lock of the process writing the coordinator state (``coordinator/lock``)."""
    return RunLock(output_dir / "coordinator" / "lock", f"the coordinator state in {output_dir}")
