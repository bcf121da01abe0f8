"""The machine to one test: a Compose stack runs while no other test does.

A stack's containers run in the Docker engine's CPU cgroup, which the kernel (cgroup v1, as on
our CI machines) weighs as one process against each process of the tests beside it: with a few
parallel workers running process federations, a stack gets a fraction of a core, its rounds run
into their timeouts and the run fails or takes many minutes. So every test holds a shared lock
on one file of the run while it runs (``tests/conftest.py``), and :func:`alone` trades the
calling test's share for the exclusive lock: it waits for the tests running on the other
workers to end, and no other test starts until it is done.

Writers go first: a test waiting in :func:`alone` holds the gate, which every test takes on its
way in, so new tests wait behind it instead of overtaking it for ever. Without pytest-xdist
(``-n 0``) there is one test at a time already and nothing is locked.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

#: Open lock files of this worker process: (gate, lock); None outside a parallel run.
_files: tuple[IO[bytes], IO[bytes]] | None = None


def open_locks(folder: Path) -> None:
    """Lock from now on, with the lock files in ``folder`` (a folder all workers share)."""
    global _files
    _files = ((folder / "machine.gate").open("ab"), (folder / "machine.lock").open("ab"))


def _enter_shared(gate: IO[bytes], lock: IO[bytes]) -> None:
    fcntl.flock(gate, fcntl.LOCK_SH)  # waits while a test waits for, or holds, the machine
    try:
        fcntl.flock(lock, fcntl.LOCK_SH)
    finally:
        fcntl.flock(gate, fcntl.LOCK_UN)


@contextmanager
def shared() -> Iterator[None]:
    """Hold this worker's share of the machine (every test, around its whole run)."""
    if _files is None:
        yield
        return
    gate, lock = _files
    _enter_shared(gate, lock)
    try:
        yield
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)


@contextmanager
def alone() -> Iterator[None]:
    """Run the block while no test runs on another worker (inside a test holding its share)."""
    if _files is None:
        yield
        return
    gate, lock = _files
    fcntl.flock(lock, fcntl.LOCK_UN)
    fcntl.flock(gate, fcntl.LOCK_EX)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    finally:
        fcntl.flock(gate, fcntl.LOCK_UN)
        _enter_shared(gate, lock)  # the test goes on holding its share, as it came in
