"""Let ``malloc`` keep the buffers a round frees, so that the next round reuses them.

Every round allocates and frees buffers of the same sizes: gRPC's message slices, chunk
frames, payloads being assembled, decoded and encoded, per-tensor scratch. glibc's defaults give
much of that back to the kernel as soon as it is freed: a block above the adaptive mmap
threshold is unmapped on ``free``, and a heap whose free top passes 128 KiB is trimmed. The
next round then faults the same memory back in, one zeroed 4 KiB page at a time, which on a
virtual machine costs more than using the bytes. Two ``mallopt`` settings keep it instead:

- ``M_MMAP_THRESHOLD`` fixed at 4 MiB: blocks below it come from malloc's heaps. Larger
  ones are mapped and unmapped as before: at 8 or 32 MiB the coordinator's peak memory at 100M
  parameters grew by one model (2.7 to 3.1 GB in ``bench/runtime_overhead.py``), at 4 MiB it
  stayed where it was.
- ``M_TRIM_THRESHOLD`` at 16 MiB: a heap keeps up to that much free memory at its top.

Measured with ``bench/network_transport.py``'s round (1M float32 parameters, N = 4, loopback,
63 rounds, on the 2-core development VM, 3 interleaved before/after pairs): the five
processes took about 700 minor page faults per round instead of 19,000, and the median round
period went from 0.124-0.127 s to 0.106-0.107 s in plaintext, from 0.132-0.135 s to
0.120-0.121 s with mTLS. Either setting alone was slower than neither
(``docs/performance.md``, *Freed memory*).

A third setting keeps what malloc holds independent of the number of threads, and so of the
number of participants (the coordinator's gRPC server runs a few handler threads per
participant): ``M_ARENA_MAX`` at 4. glibc gives threads their own heaps ("arenas"), up to
8 per core, and each keeps up to the trim threshold of freed memory. At 10M parameters and
16 participants uploading at once over mTLS, the coordinator's peak memory went from 953 MB
to 874 MB with 4 arenas (858 MB with 2), against 670 and 645 MB with 4 participants
(``docs/performance.md``, *Memory independent of the number of participants*).

An operator who sets a threshold or the arena count in ``GLIBC_TUNABLES`` (or the arena count
in ``MALLOC_ARENA_MAX``) keeps their choice; other C libraries (musl, macOS) are left alone.
"""

from __future__ import annotations

import ctypes
import os

#: ``mallopt`` parameters (glibc ``malloc.h``).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
#: Blocks smaller than this (bytes) come from malloc's heaps and are kept when freed.
MMAP_THRESHOLD_BYTES = 4 << 20
#: Free bytes a heap keeps at its top before it gives them back to the kernel.
TRIM_THRESHOLD_BYTES = 16 << 20
#: Most malloc heaps (arenas) the threads of one process share.
ARENAS = 4
_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")


def _is_glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (AttributeError, ValueError, OSError):  # no confstr (Windows), or not glibc's name
        return False


def keep_freed_buffers() -> bool:
    """Set this process's mmap and trim thresholds and its arena count (see the module docstring).

    Call it once at process start, before it starts threads; it affects allocations made after
    it. It changes no computed value, only where freed memory goes.

    Returns:
        True when both thresholds were set; False when the C library is not glibc, when
        ``GLIBC_TUNABLES`` already sets either threshold, or when ``mallopt`` refused. (The
        arena count is set, or left to the operator, either way.) Raises nothing.
    """
    if not _is_glibc():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.arena_max" not in tunables and "MALLOC_ARENA_MAX" not in os.environ:
        mallopt(M_ARENA_MAX, ARENAS)
    if any(name in tunables for name in _TUNABLES):
        return False
    # Set together: either one alone made rounds slower than glibc's defaults.
    return bool(
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
