"""How many torch threads a participant process uses: the cores it is given, not the host's.

torch starts one intra-op thread per core of the host. In a container limited to one core, or
with four participants on one host, those threads outnumber the cores they may run on and spin
against each other. A participant's training already runs on one thread for bit-identical
results (:mod:`lensemble.machinery.determinism`); what the count changes is everything else it
does with tensors (decode, pseudo-gradient, quantization), so it changes speed, never a hash.

The cores a process is given are the fewest of: the CPUs its affinity mask allows
(``sched_getaffinity``), its cgroup's CPU quota (cgroup v2 ``cpu.max``, else v1
``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``: what Compose's ``cpus`` and a Kubernetes CPU limit
set), and ``deployment.resources.participant.cpu`` of the config, which every substrate also
turns into that limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from lensemble.config.schema import LensembleConfig
from lensemble.config.sections import cpu_cores
from lensemble.machinery.cpus import CGROUP_ROOT, affinity_cpus, cgroup_quota


@dataclass(frozen=True)
class ThreadBudget:
    """A participant's torch thread count and where it came from.

    Attributes:
        threads: Intra-op threads to use (at least 1).
        affinity: CPUs the process may run on.
        quota: The cgroup's CPU quota in cores, or None when unlimited or unknown.
        configured: ``deployment.resources.participant.cpu`` in cores.
    """

    threads: int
    affinity: int
    quota: float | None
    configured: float

    def describe(self) -> str:
        """One line for the participant's log."""
        quota = "none" if self.quota is None else f"{self.quota:g}"
        return (
            f"torch threads: {self.threads} (affinity {self.affinity} CPUs, cgroup quota "
            f"{quota}, deployment.resources.participant.cpu {self.configured:g})"
        )


def participant_threads(
    config: LensembleConfig, *, affinity: int | None = None, cgroup_root: Path = CGROUP_ROOT
) -> ThreadBudget:
    """The participant's torch threads: the whole cores of the fewest it is given, at least 1.

    Args:
        config: The run's config (``deployment.resources.participant.cpu``).
        affinity: CPUs allowed (default: read from the process).
        cgroup_root: Where this process's cgroup is mounted (its CPU quota).

    Returns:
        The count and its sources.
    """
    allowed = affinity_cpus() if affinity is None else affinity
    quota = cgroup_quota(cgroup_root)
    configured = float(cpu_cores(config.deployment.resources.participant.cpu))
    cores = min(float(allowed), configured, math.inf if quota is None else quota)
    return ThreadBudget(max(1, math.floor(cores)), allowed, quota, configured)
