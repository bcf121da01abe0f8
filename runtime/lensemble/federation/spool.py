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
Without an output folder, or when the folder has no room, the payload bytes are kept in memory
instead (same reader).
"""

from __future__ import annotations

import errno
import functools
import hashlib
import io
import logging
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from lensemble.durable import DiskFull, check_free_space
from lensemble.errors import IntegrityError
from lensemble.federation.payload import Decoded, TensorRange, dtype_token
from lensemble.federation.quantization import SCALE_SUFFIX, WIRE_DTYPES

_log = logging.getLogger("lensemble.federation.spool")


@functools.cache
def _hashing_thread() -> ThreadPoolExecutor:
    """The one thread that hashes blocks read back (FIFO, so each stream stays in order)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="lensemble-spool-hash")


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


class _Positional(io.RawIOBase):
    """Reads an unnamed spool file from its start with ``pread``.

    The descriptor's own offset is left alone, so each reader has its own position; closing the
    reader leaves the file open.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._at = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        n = os.preadv(self._fd, [buffer], self._at)
        self._at += n
        return n


class UpdateSpool:
    """Accepted update payloads of the attempt being collected, by participant id.

    Args:
        folder: Where to spill payloads (created on first use), or None to keep them in memory.
    """

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self._entries: dict[str, _Entry] = {}
        self._count = 0

    def __contains__(self, pid: object) -> bool:
        return pid in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def reset(self) -> None:
        """Forget every entry, close every unnamed file and delete every named one.

        Named leftovers of a crash are deleted too.
        """
        for entry in self._entries.values():
            if entry.fd is not None:
                os.close(entry.fd)
        self._entries.clear()
        self._count = 0
        if self.folder is not None and self.folder.is_dir():
            for path in self.folder.glob("update-*.safetensors"):
                path.unlink(missing_ok=True)

    def add(
        self, pid: str, payload: bytes | bytearray | memoryview, digest: str, decoded: Decoded
    ) -> None:
        """Keep ``pid``'s accepted payload: spill it, or hold its bytes when there is no room.

        Args:
            pid: The contributor.
            payload: The payload bytes exactly as accepted.
            digest: Their ``sha256:<hex>``, as the coordinator checked it (not recomputed).
            decoded: :func:`~lensemble.federation.payload.decode` of ``payload`` (its layout is
                what the reader trusts; the bytes themselves are re-checked).
        """
        view = memoryview(payload).cast("B")
        path = fd = None
        data = None
        if self.folder is not None:
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
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        check_free_space(self.folder, len(view))
        fd = _unnamed_file(self.folder)
        if fd is not None:
            try:
                written = 0
                while written < len(view):
                    written += os.write(fd, view[written:])
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

    def reader(
        self, pid: str, *, scheme: str, chunk: int, block: int, factor: float | None = None
    ) -> SpooledUpdate:
        """Stream ``pid``'s update back as float32 blocks (see :class:`SpooledUpdate`).

        Raises:
            KeyError: ``pid`` has no entry.
        """
        entry = self._entries[pid]
        return SpooledUpdate(pid, entry, scheme=scheme, chunk=chunk, block=block, factor=factor)


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
        self._source: io.RawIOBase | io.BytesIO
        if entry.fd is not None:
            self._source = _Positional(entry.fd)
        elif entry.path is not None:
            try:
                self._source = open(entry.path, "rb", buffering=0)  # noqa: SIM115 (closed in finish)
            except OSError as exc:
                raise self._broken(f"it cannot be read ({exc.strerror})") from None
        else:
            assert entry.data is not None
            self._source = io.BytesIO(entry.data)
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
        """The next ``n`` bytes (a view of the reusable buffer, valid until the next call)."""
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
            self._pending[turn] = _hashing_thread().submit(self._hash.update, view)
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
                values = torch.frombuffer(raw, dtype=wire).to(torch.float32)
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
        self._source.close()

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
            if self._source.read(1):
                raise self._broken(f"it is longer than the {self._entry.size} bytes accepted")
            if self._hash is not None and self._hash.hexdigest() != self._entry.digest:
                raise self._broken("its SHA-256 differs from the accepted payload's")
        finally:
            self._source.close()
