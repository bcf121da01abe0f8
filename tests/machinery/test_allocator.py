"""malloc keeps freed buffers and a few heaps for every command; an operator's own settings win."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lensemble import cli
from lensemble.machinery import allocator
from lensemble.machinery.allocator import keep_freed_buffers

GLIBC = allocator._is_glibc()

#: A child that allocates, touches and frees buffers of 16 growing sizes up to just below the
#: kept size (4 MiB) and prints the minor page faults that took. glibc's adaptive threshold maps
#: each new, larger size afresh, so by default every buffer is faulted in again; kept memory is
#: faulted in about once.
FAULTS = """
import resource, sys
from lensemble.machinery.allocator import keep_freed_buffers
if sys.argv[1] == "kept":
    assert keep_freed_buffers()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for k in range(1, 17):
    n = k * (256 << 10) - 4096
    b = bytearray(n)
    b[::4096] = bytes(len(range(0, n, 4096)))
    del b
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    out = subprocess.run(
        [sys.executable, "-c", FAULTS, mode],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=60,
    )
    return int(out.stdout)


@pytest.mark.skipif(not GLIBC, reason="the thresholds are glibc's (this C library is not)")
def test_freed_buffers_are_reused_instead_of_faulted_in_again() -> None:
    default, kept = _faults("default"), _faults("kept")
    pages_of_largest = (4 << 20) // 4096
    assert default > 4 * pages_of_largest, default  # each size faulted in afresh
    assert kept < 3 * pages_of_largest, kept  # about the largest buffer's pages, once


#: A child whose 12 threads, alive at once, each allocate a block from malloc's heaps, then
#: print malloc's own per-arena statistics (glibc's malloc_stats, on stderr): a thread's first
#: allocation takes a new arena while the process has fewer than its limit.
ARENAS = """
import ctypes, sys, threading
from lensemble.machinery.allocator import keep_freed_buffers
if sys.argv[1] == "kept":
    assert keep_freed_buffers()
held, everyone = [], threading.Barrier(12)
def allocate():
    held.append(bytearray(1 << 20))
    everyone.wait()  # alive at once: a finished thread's arena would go to the next one
threads = [threading.Thread(target=allocate) for _ in range(12)]
for t in threads: t.start()
for t in threads: t.join()
ctypes.CDLL(None).malloc_stats()
"""


def _arenas(mode: str, **env: str) -> int:
    child_env = {
        k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "MALLOC_ARENA_MAX")
    }
    out = subprocess.run(
        [sys.executable, "-c", ARENAS, mode],
        capture_output=True,
        text=True,
        check=True,
        env={**child_env, **env},
        timeout=60,
    )
    return sum(line.startswith("Arena ") for line in out.stderr.splitlines())


@pytest.mark.skipif(not GLIBC, reason="the arena limit is glibc's (this C library is not)")
def test_threads_share_a_few_heaps_and_an_operator_s_arena_limit_wins() -> None:
    assert _arenas("default") > allocator.ARENAS  # one heap per thread, up to 8 per core
    assert _arenas("kept") <= allocator.ARENAS
    assert _arenas("kept", MALLOC_ARENA_MAX="8") > allocator.ARENAS


def test_an_operator_who_set_a_threshold_keeps_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for tunables in ("glibc.malloc.trim_threshold=0", "glibc.malloc.mmap_threshold=4096"):
        monkeypatch.setenv("GLIBC_TUNABLES", f"glibc.malloc.hugetlb=1:{tunables}")
        assert keep_freed_buffers() is False


def test_other_c_libraries_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_glibc(name: str) -> str:
        raise ValueError(name)

    monkeypatch.setattr(allocator.os, "confstr", not_glibc)
    assert keep_freed_buffers() is False


def test_every_command_starts_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(cli, "keep_freed_buffers", lambda: calls.append("kept") or True)
    monkeypatch.setattr(cli, "app", lambda: calls.append("app"))
    cli.main()
    assert calls == ["kept", "app"]
