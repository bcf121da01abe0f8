"""The one door between a transport's receiving threads and the coordinator.

A transport that receives updates as streams (the network one) runs handler threads beside the
coordinator's single thread. Those threads never hold the coordinator: before its first round
the coordinator gives its transport an :class:`Intake` (:meth:`CoordinatorTransport.attach
<lensemble.federation.transport.CoordinatorTransport.attach>`), and that is all they may ask of
it: a :class:`Landing` to write one incoming payload into, so that an update being received or
waiting for its verdict is not held in memory. The finished submission then reaches the
coordinator the ordinary way, through :meth:`CoordinatorTransport.receive`, carrying its landing
(:attr:`lensemble.federation.messages.Submission.landed`); an accepted update keeps the file as
it is, without a second write (:mod:`lensemble.federation.spool`).
"""

from __future__ import annotations

import errno
import mmap
import os
import weakref
from collections.abc import Callable
from typing import Any

from lensemble.machinery.fresh_bytes import BytesBuilder

#: Gives an unnamed file back to whoever lent it (the coordinator's spool).
GiveBack = Callable[[int], None]


class Landing:
    """One incoming payload written into an unnamed file as its chunks arrive.

    :meth:`write` appends (one ``pwrite`` per chunk, nothing kept in memory); :meth:`finish`
    maps the whole file read-only and returns a view of it, the submission's payload (its
    length is what the transport reads of it); the coordinator judges a private copy read back
    with :meth:`read_back`. When the coordinator keeps the update, its spool adopts the file
    (:meth:`adopt`); otherwise the file goes back through ``give_back`` once the last view of
    its mapping is gone (never earlier: reusing it would change, or cut short, bytes still
    visible), or when the landing is dropped unfinished.

    Args:
        fd: The unnamed file (owned by this landing until adopted or given back).
        size: Bytes the stream declared.
        give_back: Called with ``fd`` once nobody can see the file's bytes any more.
    """

    def __init__(self, fd: int, size: int, give_back: GiveBack) -> None:
        self.size = size
        self._fd = fd
        self._at = 0
        self._give_back = give_back
        self._release: Any = weakref.finalize(self, give_back, fd)

    def write(self, piece: bytes | bytearray | memoryview) -> None:
        """Append ``piece`` at the end of what was written (the caller bounds the total).

        Raises:
            OSError: The write failed (no room left, an I/O error).
        """
        view = memoryview(piece).cast("B")
        done = 0
        while done < len(view):
            done += os.pwrite(self._fd, view[done:], self._at + done)
        self._at += done

    def finish(self) -> memoryview:
        """A read-only view of the ``size`` bytes written (a shared mapping of the file).

        Raises:
            OSError: The file could not be cut to length or mapped.
        """
        assert self._at == self.size, "the caller checks the stream is complete"
        os.ftruncate(self._fd, self.size)  # a reused file may have been longer
        mapping = mmap.mmap(self._fd, self.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        # From now on the file goes back with the mapping's last view, not with this object.
        self._release.detach()
        self._release = weakref.finalize(mapping, self._give_back, self._fd)
        return memoryview(mapping)

    def read_back(self) -> bytes:
        """A private copy of the ``size`` bytes written, read from the file with ``pread``.

        The file is on disk from the first chunk on, where another process of the
        coordinator's user can change it (``/proc/<pid>/fd``); the coordinator judges this copy
        and checks its SHA-256, so what it judges is exactly what it hashed. Read with
        ``pread``, not through the mapping: a file cut short makes a short read here, where a
        mapping would raise ``SIGBUS``.

        Raises:
            OSError: The file cannot be read, or holds fewer than ``size`` bytes now.
        """
        builder = BytesBuilder(self.size, recycle=True)
        while builder.written < self.size:
            tail = builder.tail()
            n = os.preadv(self._fd, [tail], builder.written)
            del tail
            if n == 0:
                raise OSError(
                    errno.EIO, f"the file holds {builder.written} of {self.size} bytes now"
                )
            builder.advance(n)
        return builder.finish()

    def adopt(self) -> int:
        """Hand the file over to the spool entry that keeps it (which then owns it)."""
        self._release.detach()
        return self._fd


class Intake:
    """What a transport's receiving threads may ask of the coordinator. Thread-safe.

    Args:
        land: Gives a :class:`Landing` for one payload of ``size`` bytes, or None to receive
            it in memory (no spool folder, no unnamed files, no room). None lands nothing.
    """

    def __init__(self, land: Callable[[int], Landing | None] | None = None) -> None:
        self._land = land

    def land(self, size: int) -> Landing | None:
        """An unnamed file to receive one payload of ``size`` bytes into, or None (memory).

        Args:
            size: The payload's declared size (bytes), already checked against its cap.
        """
        return self._land(size) if self._land is not None else None
