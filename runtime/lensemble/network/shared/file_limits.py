"""The process's open-file limit: raised to its hard ceiling at start, and counted.

Every connection a server accepts is a file descriptor, and so is every file the coordinator
writes (spool, ledger, checkpoints). The common default soft limit of 1,024 descriptors let
1,100 idle connections make the coordinator fail while spooling an honest update. Each process
therefore raises its soft ``RLIMIT_NOFILE`` to the hard one at start (the hard limit is what
the container runtime or ``ulimit -Hn`` allows; no privilege raises it), and the coordinator
budgets what is left among its ports
(:mod:`lensemble.network.coordinator.connection_budget`).
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

#: What a soft limit is raised to when the hard one is unlimited (Linux's default ``nr_open``).
UNLIMITED_TARGET = 1 << 20


@dataclass(frozen=True)
class FileLimit:
    """The open-file limit before and after :func:`raise_open_file_limit`.

    Attributes:
        before: The soft limit the process started with (descriptors).
        soft: The soft limit now: the most descriptors the process may hold.
        hard: The hard limit (the ceiling an unprivileged process may raise ``soft`` to).
    """

    before: int
    soft: int
    hard: int


def _finite(value: int) -> int:
    return UNLIMITED_TARGET if value == resource.RLIM_INFINITY else int(value)


def raise_open_file_limit() -> FileLimit:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; returns both, before and after.

    Never raises: a refusal (a sandbox that forbids ``setrlimit``) keeps the limit as it was.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _finite(hard)
    if _finite(soft) < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            target = _finite(soft)
    now, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return FileLimit(_finite(soft), _finite(now), _finite(hard))


def open_file_limit() -> int:
    """The soft ``RLIMIT_NOFILE`` now (descriptors)."""
    return _finite(resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def descriptors_in_use() -> int:
    """Descriptors this process holds now (count; ``/proc/self/fd``, 0 where it is missing)."""
    try:
        return max(0, len(os.listdir("/proc/self/fd")) - 1)  # minus the listing's own
    except OSError:
        return 0
