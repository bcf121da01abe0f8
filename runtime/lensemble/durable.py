"""Durable, crash-consistent file writes, and a full disk reported as one sentence.

Every file Lensemble writes under a run folder (checkpoints, ledger, metrics, certificates) goes
through this module:

- :func:`atomic_write` writes a temporary file in the target's folder, fsyncs it, renames it
  over the target and fsyncs the folder, so after a crash the target is either the old or the
  new content and the rename itself survives power loss. The temporary file is removed on any
  error.
- :func:`append_line` appends one line with a single ``write`` and fsyncs it.
- :func:`check_free_space` refuses before writing when the folder's filesystem has less room
  than a write needs (a restart never starts writing into a full disk).
- ``ENOSPC``, ``EDQUOT`` and ``EIO`` become :class:`DiskFull` / :class:`DiskError` naming the
  folder and the space needed.

A test can inject a crash at every write point with :func:`set_crash_hook`.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from lensemble.errors import EXIT_RUN_FAILED, LensembleError

#: Extra room kept free beyond a write's own size (bytes): metadata, the ledger line after it.
HEADROOM_BYTES = 1 << 20

_FULL = (errno.ENOSPC, errno.EDQUOT)

#: The installed crash hook (a one-slot list, so tests swap it without ``global``).
_CRASH_HOOK: list[Callable[[str], None] | None] = [None]


class DiskFull(LensembleError):
    """A folder's filesystem has no room for a write (ENOSPC, EDQUOT); nothing half-written."""

    code = "disk_full"
    exit_code = EXIT_RUN_FAILED


class DiskError(LensembleError):
    """The filesystem failed a write (EIO); nothing half-written."""

    code = "disk_error"
    exit_code = EXIT_RUN_FAILED


class SimulatedCrash(BaseException):
    """Raised by a test's crash hook: stops everything like ``kill -9`` (not an ``Exception``)."""


def set_crash_hook(hook: Callable[[str], None] | None) -> None:
    """Install a function called with a label at every write point (tests simulate crashes).

    Args:
        hook: Called as ``hook("before-rename:<path>")`` etc.; raising from it stops the write
            there, exactly as a crash would (temporary files are left as a crash leaves them).
    """
    _CRASH_HOOK[0] = hook


def crash_point(label: str) -> None:
    """Call the crash hook, if any, at a named write point."""
    hook = _CRASH_HOOK[0]
    if hook is not None:
        hook(label)


def _human(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def disk_error(exc: OSError, folder: Path, needed: int | None) -> LensembleError | None:
    """The one-sentence error for an ``OSError`` of a write into ``folder``, or None.

    Args:
        exc: The error raised by the write.
        folder: The folder written to.
        needed: Bytes the write needed (None when unknown).

    Returns:
        :class:`DiskFull` for ENOSPC/EDQUOT, :class:`DiskError` for EIO, None for anything else.
    """
    need = f" (needs {_human(needed)} plus {_human(HEADROOM_BYTES)} headroom)" if needed else ""
    if exc.errno in _FULL:
        return DiskFull(
            f"no space left in {folder}{need};",
            remediation="free space there or give the run a larger volume, then resume.",
        )
    if exc.errno == errno.EIO:
        return DiskError(
            f"the disk under {folder} failed a write (I/O error){need};",
            remediation="check the volume, then resume (the last complete state stands).",
        )
    return None


@contextmanager
def reporting(folder: Path, needed: int | None = None) -> Iterator[None]:
    """Turn ENOSPC/EDQUOT/EIO raised inside the block into :class:`DiskFull`/:class:`DiskError`.

    Args:
        folder: The folder being written (named in the error).
        needed: Bytes the block writes, when known.
    """
    try:
        yield
    except OSError as exc:
        translated = disk_error(exc, folder, needed)
        if translated is None:
            raise
        raise translated from None


def fsync_dir(folder: Path) -> None:
    """Fsync a folder so a rename or unlink inside it survives a crash (no-op where unsupported)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def check_free_space(folder: Path, needed: int) -> None:
    """Refuse before writing when ``folder`` lacks ``needed`` bytes plus headroom.

    Args:
        folder: An existing folder (or one whose nearest existing parent is checked).
        needed: Bytes about to be written.

    Raises:
        DiskFull: Not enough free space.
    """
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < needed + HEADROOM_BYTES:
        raise DiskFull(
            f"no space left in {folder}: {_human(free)} free, needs {_human(needed)} plus "
            f"{_human(HEADROOM_BYTES)} headroom;",
            remediation="free space there or give the run a larger volume, then resume.",
        )


def atomic_write(
    path: Path, data: bytes | Sequence[bytes | memoryview], *, mode: int | None = None
) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    Temporary file ``.<name>.tmp-<pid>`` in the same folder, write, fsync, rename, fsync the
    folder. On any error the temporary file is removed and ``path`` keeps its old content.

    Args:
        path: The target file; its folder is created.
        data: The complete new content, or its pieces in order (written one after the other,
            so a large file needs no buffer of its size).
        mode: Permission bits of the new file (e.g. ``0o600`` for keys); default per umask.

    Raises:
        DiskFull: The filesystem is full (names the folder and the size).
        DiskError: The filesystem failed the write (EIO).
    """
    folder = path.parent
    parts = [data] if isinstance(data, bytes | bytearray | memoryview) else list(data)
    with reporting(folder, sum(memoryview(part).nbytes for part in parts)):
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{path.name}.tmp-{os.getpid()}"
        try:
            # Exclusive and never through a link: a file or symbolic link planted at the
            # temporary name never receives the bytes (a key included). A leftover of a crash
            # (or a planted link) is removed first; unlinking a link leaves its target alone.
            tmp.unlink(missing_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(tmp, flags, 0o666 if mode is None else mode)
            try:
                for part in parts:
                    view = memoryview(part).cast("B")
                    while view:
                        written = os.write(fd, view)
                        view = view[written:]
                crash_point(f"before-fsync:{path}")
                os.fsync(fd)
            finally:
                os.close(fd)
            if mode is not None:
                os.chmod(tmp, mode)
            crash_point(f"before-rename:{path}")
            os.replace(tmp, path)
        except SimulatedCrash:
            raise  # a crash leaves its temporary file; the next write of the path replaces it
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(folder)
        crash_point(f"after-rename:{path}")


def append_line(path: Path, line: str) -> None:
    """Append ``line`` plus a newline with one ``write`` and fsync it.

    A crash leaves either the whole line or a torn last line (no newline), which readers treat
    as unwritten.

    Raises:
        DiskFull: The filesystem is full (names the folder and the size).
        DiskError: The filesystem failed the write (EIO).
    """
    data = (line + "\n").encode()
    with reporting(path.parent, len(data)):
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = path.exists()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            size = os.fstat(fd).st_size
            crash_point(f"before-append:{path}")
            try:
                written = os.write(fd, data)
                if written != len(data):
                    raise OSError(errno.ENOSPC, "short write")
                os.fsync(fd)
            except OSError:
                # Leave no torn line behind when the disk refused it.
                os.ftruncate(fd, size)
                raise
        finally:
            os.close(fd)
        if not existed:
            fsync_dir(path.parent)
        crash_point(f"after-append:{path}")


def remove(path: Path) -> None:
    """Delete a file if present and fsync its folder."""
    try:
        path.unlink()
    except FileNotFoundError:
        return
    fsync_dir(path.parent)
