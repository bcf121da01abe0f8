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
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any

import numpy as np

#: Payloads at least this large are built in place (smaller ones: a bytearray, then one copy).
LARGE = 8 << 20
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


class BytesBuilder:
    """Appends pieces into one ``bytes`` object of a size known up front.

    Args:
        size: Bytes of the finished object (>= 0).

    Raises:
        ValueError: ``size`` is negative.
    """

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"a payload cannot be {size} bytes long")
        self.size = size
        self.written = 0
        self._out: bytes | bytearray
        api = _c_api() if size >= LARGE else None
        if api is None:
            self._out = bytearray(size)
            self._dest = np.frombuffer(self._out, dtype=np.uint8)
            return
        new, address, madvise = api
        self._out = new(None, size)
        start = address(self._out)
        first = -(-start // _HUGE_PAGE) * _HUGE_PAGE
        last = (start + size) // _HUGE_PAGE * _HUGE_PAGE
        if last > first:
            madvise(first, last - first, _MADV_HUGEPAGE)  # advice only: failure changes nothing
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
        return out if isinstance(out, bytes) else bytes(out)
