"""The CPUs this process is given: its affinity mask and its cgroup's CPU quota.

torch and thread pools size themselves to the host's cores by default; in a container limited to
one core, or beside other participants on one host, that is more than the process may use.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_quota(root: Path = CGROUP_ROOT) -> float | None:
    """The CPU quota of this process's cgroup in cores, or None when unlimited or unreadable.

    Reads cgroup v2 ``cpu.max`` (``"<quota> <period>"`` or ``"max <period>"``, microseconds),
    else cgroup v1 ``cpu/cpu.cfs_quota_us`` and ``cpu/cpu.cfs_period_us`` (quota ``-1``: none).
    """
    try:
        fields = (root / "cpu.max").read_text().split()
        if len(fields) == 2 and fields[0] != "max":
            return int(fields[0]) / int(fields[1])
        return None
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def affinity_cpus() -> int:
    """CPUs this process may run on (its affinity mask; the CPU count where there is none)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cores_given(cgroup_root: Path = CGROUP_ROOT) -> int:
    """Whole cores this process may keep busy: its affinity, capped by its cgroup quota (>= 1)."""
    quota = cgroup_quota(cgroup_root)
    return max(1, math.floor(min(float(affinity_cpus()), math.inf if quota is None else quota)))
