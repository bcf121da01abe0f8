"""malloc keeps freed buffers for every command, and an operator's own thresholds win."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lensemble import allocator, cli
from lensemble.allocator import keep_freed_buffers

GLIBC = allocator._is_glibc()

#: A child that allocates, touches and frees buffers of 16 growing sizes up to just below the
#: kept size (4 MiB) and prints the minor page faults that took. glibc's adaptive threshold maps
#: each new, larger size afresh, so by default every buffer is faulted in again; kept memory is
#: faulted in about once.
FAULTS = """
import resource, sys
from lensemble.allocator import keep_freed_buffers
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
