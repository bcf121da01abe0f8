"""A large ``bytes`` object filled in place, before anyone else can see it.

Payloads arrive and leave as ``bytes`` (immutable, so a payload handed to a transport or a
spool cannot change under it). Building one of known size the usual ways costs more than the
copy that fills it: ``io.BytesIO`` or ``bytearray`` of the final size first writes zeros over
all of it, ``b"".join`` and ``bytes(bytearray)`` fault a fresh mapping in 4 KiB page by page,
and on the development VM either ran at a fraction of ``numpy.copyto``'s speed
(``bench/runtime_overhead.py``, ``bench/network_transport.py``). A large payload is therefore
created uninitialised through CPython's documented ``PyBytes_FromStringAndSize(NULL, n)``, its
buffer advised to use transparent huge pages, and filled by numpy; only :meth:`BytesBuilder.
finish` hands it out, and only once every byte has been written, so no uninitialised byte is
ever seen. Small payloads, and any interpreter without that C API, use a ``bytearray``.

A builder made with ``recycle=True`` (the encoder of outgoing payloads, and the assembler of
incoming streams, ``lensemble.network.shared.streams.Assembler``) also keeps the last object it
finished, and the next such builder of the same size writes over it instead of faulting in new
pages, but only when nothing else holds it any more: its reference count shows the slot is its
only holder. Every view of a ``bytes`` object (``memoryview``, numpy, ``torch.frombuffer``)
holds a reference, so an object that can still be seen is never reused. The cached hash is
reset, so to Python it is a new object with the same identity. One slot per process: the
memory kept is one released payload, which the next one would have taken anyway.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading
from typing import Any

import numpy as np

#: Payloads at least this large (bytes) are built in place and recycled (smaller ones: a
#: bytearray, then one copy). At 8 MiB the 4 MB payloads of a 1M-parameter model took the slow
#: way; at 1 MiB the round period of ``bench/network_transport.py`` at 1M parameters went from
#: 0.109-0.114 to 0.100-0.104 s over mTLS and from 0.097-0.099 to 0.094-0.097 s in plaintext
#: (3 interleaved pairs of 30 rounds each). Smaller thresholds were not measured.
LARGE = 1 << 20
_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14  # Linux <sys/mman.h>


@functools.cache
def _c_api() -> tuple[Any, Any, Any] | None:
    """CPython's uninitialised-bytes constructor, its buffer address and libc's madvise."""
    if sys.platform != "linux" or sys.implementation.name != "cpython":
        return None
    try:
        new = ctypes.pythonapi.PyBytes_FromStringAndSize
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_ssize_t]
        address = ctypes.pythonapi.PyBytes_AsString
        address.restype, address.argtypes = ctypes.c_void_p, [ctypes.py_object]
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (AttributeError, OSError):  # pragma: no cover - not CPython on Linux
        return None
    return new, address, madvise


@functools.cache
def _hash_slot_offset() -> int | None:
    """Bytes from a ``bytes`` object's data back to its cached hash, or None if unknown.

    CPython 3.11-3.13 store the hash (``ob_shash``) just before the data; checked here against
    ``hash()`` of a probe rather than assumed, and recycling is off when it does not hold or
    when reference counts are not exact (a free-threaded build).
    """
    api = _c_api()
    if api is None or not getattr(sys, "_is_gil_enabled", lambda: True)():
        return None
    new, address, _ = api
    probe = new(None, 64)
    ctypes.memset(address(probe), 7, 64)
    expected = hash(probe)
    offset = ctypes.sizeof(ctypes.c_ssize_t)
    found = ctypes.c_ssize_t.from_address(address(probe) - offset).value
    kept = [probe]
    del probe
    only_holder = sys.getrefcount(kept[0]) == 2  # the list's reference and the argument's
    return offset if found == expected and only_holder else None


class _Slot:
    """The last recyclable object finished in this process, to be written over when free."""

    def __init__(self) -> None:
        self._kept: list[bytes] = []
        self._lock = threading.Lock()

    def take(self, size: int) -> bytes | None:
        """The kept object if it is ``size`` bytes long and nothing else holds it."""
        offset = _hash_slot_offset()
        api = _c_api()
        if offset is None or api is None:
            return None
        with self._lock:
            # References: the list's and getrefcount's argument; any other holder adds one.
            if not self._kept or len(self._kept[0]) != size or sys.getrefcount(self._kept[0]) != 2:
                return None
            out = self._kept.pop()
        ctypes.c_ssize_t.from_address(api[1](out) - offset).value = -1  # no cached hash
        return out

    def keep(self, out: bytes) -> None:
        with self._lock:
            self._kept[:] = [out]


_SLOT = _Slot()


class BytesBuilder:
    """Appends pieces into one ``bytes`` object of a size known up front.

    Args:
        size: Bytes of the finished object (>= 0).
        recycle: Write over the last recyclable object of this size when nothing holds it,
            and keep this one for the next builder (see the module's docstring).

    Raises:
        ValueError: ``size`` is negative.
    """

    def __init__(self, size: int, *, recycle: bool = False) -> None:
        if size < 0:
            raise ValueError(f"a payload cannot be {size} bytes long")
        self.size = size
        self.written = 0
        self._recycle = recycle
        self._out: bytes | bytearray
        api = _c_api() if size >= LARGE else None
        if api is None:
            self._recycle = False
            self._out = bytearray(size)
            self._dest = np.frombuffer(self._out, dtype=np.uint8)
            return
        new, address, madvise = api
        reused = _SLOT.take(size) if recycle else None
        self._out = reused if reused is not None else new(None, size)
        start = address(self._out)
        if reused is None:
            first = -(-start // _HUGE_PAGE) * _HUGE_PAGE
            last = (start + size) // _HUGE_PAGE * _HUGE_PAGE
            if last > first:
                madvise(first, last - first, _MADV_HUGEPAGE)  # advice only
        self._dest = np.ctypeslib.as_array((ctypes.c_ubyte * size).from_address(start))

    def write(self, piece: bytes | bytearray | memoryview) -> None:
        """Append ``piece`` (one copy of it).

        Raises:
            ValueError: It would take the object past its size (nothing of it is written).
        """
        values = np.frombuffer(piece, dtype=np.uint8)
        end = self.written + values.size
        if end > self.size:
            raise ValueError(f"{end} bytes would not fit in {self.size}")
        self._dest[self.written : end] = values
        self.written = end

    def tail(self) -> memoryview:
        """A writable view of the bytes not written yet, for ``socket.recv_into``.

        Bytes read into it count once :meth:`advance` says so. Drop the view before
        :meth:`finish`: it writes into the object that :meth:`finish` hands out.
        """
        return memoryview(self._dest)[self.written :]  # type: ignore[arg-type]

    def advance(self, n: int) -> None:
        """Count ``n`` more bytes written through :meth:`tail`.

        Raises:
            ValueError: That would take the object past its size.
        """
        if not 0 <= n <= self.size - self.written:
            raise ValueError(f"{self.written + n} bytes would not fit in {self.size}")
        self.written += n

    def finish(self) -> bytes:
        """The object, once every byte is written; the builder is empty afterwards.

        Raises:
            ValueError: Fewer than ``size`` bytes were written.
        """
        if self.written != self.size:
            raise ValueError(f"{self.written} of {self.size} bytes were written")
        out, self._out = self._out, bytearray()
        self._dest = np.empty(0, dtype=np.uint8)
        self.size = self.written = 0
        if not isinstance(out, bytes):
            return bytes(out)
        if self._recycle:
            _SLOT.keep(out)
        return out
