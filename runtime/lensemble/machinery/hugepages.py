"""Transparent huge pages for model-sized buffers: fewer page faults, fewer TLB misses.

A round touches several model-sized buffers that are freshly allocated (the model payload,
the outer step's results, the reduction's scratch); on 4 KiB pages the kernel faults each one
in page by page, which on virtual machines costs more than the copy itself, and hashing from
4 KiB pages runs below ``hashlib``'s speed on huge-page memory (``bench/runtime_overhead.py``
measures both). Two switches ask for 2 MiB pages where the kernel's policy is ``madvise``
(``/sys/kernel/mm/transparent_hugepage/enabled``; ``never`` turns them off, ``always`` makes
them moot); neither changes a single computed bit:

- ``THP_MEM_ALLOC_ENABLE=1``: PyTorch's CPU allocator aligns allocations of 2 MiB and more
  to 2 MiB and advises huge pages for them. Read once, at torch's first allocation, so it can
  be set from Python before torch is imported (:func:`enable_for_this_process`).
- ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (glibc 2.35+): ``malloc`` advises huge pages for
  what it maps, which covers Python ``bytes`` such as payloads. Read by the dynamic loader at
  process start, so only a process's environment can set it: the image does (``Dockerfile``).
"""

from __future__ import annotations

import os

#: The environment the container image runs with (its ``Dockerfile`` sets these; a test keeps
#: the two in step). A variable already set is left as it is, so an operator can turn either off.
HUGEPAGE_ENV: dict[str, str] = {
    "THP_MEM_ALLOC_ENABLE": "1",
    "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1",
}


def enable_for_this_process() -> None:
    """Ask torch's CPU allocator for huge pages, unless the environment already decided.

    Effective only before torch's first allocation (call it before ``import torch``); the
    ``malloc`` switch cannot be set from inside a running process and is left to its
    environment. Raises nothing.
    """
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", HUGEPAGE_ENV["THP_MEM_ALLOC_ENABLE"])
