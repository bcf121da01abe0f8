"""What one participant's rank group asks of a substrate, computed once for every renderer.

A participant whose rank layout (:meth:`LensembleConfig.rank_layout`) has more than one rank runs
its inner loop under torch's elastic launcher: ``lensemble participant`` itself starts
``processes_per_node`` local ranks on each of ``nodes`` hosts (``docs/architecture.md``,
multi-rank participants). Compose, the Helm chart and the Pulumi program all size a participant's
container (pod) and its hosts from :class:`RankPod`, so the three never disagree.

``deployment.resources.participant`` is read as the need of one *rank* for CPU and memory (a rank
is a whole trainer process), and as the GPUs of one *pod*: a pod running ``processes_per_node``
ranks asks for that many times the CPU and memory, and, with nccl, at least one GPU per rank.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

from lensemble.config.schema import LensembleConfig, RankLayout

#: Label (pod and Service) naming the participant a rank group belongs to.
PARTICIPANT_LABEL = "lensemble.dev/participant"
#: Label Kubernetes puts on every StatefulSet pod (1.28+): its ordinal, here the node rank.
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
#: Shared memory (/dev/shm) per local rank, MiB. Docker and Kubernetes give 64 MiB, too little
#: for torch.distributed's intra-host transfers (nccl above all) with several ranks.
SHM_PER_RANK_MIB = 512

_MEMORY = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<unit>[KMGT]i?)?")


def _decimal_text(value: Decimal) -> str:
    return format(value.normalize(), "f")


def scale_cpu(quantity: str, factor: int) -> str:
    """A Kubernetes CPU quantity times ``factor``: ``("500m", 3)`` -> ``"1500m"``.

    Args:
        quantity: CPU cores as a Kubernetes quantity (``K8S_CPU`` of the config schema).
        factor: Ranks per pod (count, at least 1).

    Returns:
        The product, in the unit of ``quantity``.
    """
    if quantity.endswith("m"):
        return f"{int(quantity[:-1]) * factor}m"
    return _decimal_text(Decimal(quantity) * factor)


def scale_memory(quantity: str, factor: int) -> str:
    """A Kubernetes memory quantity times ``factor``: ``("1.5Gi", 2)`` -> ``"3Gi"``.

    Args:
        quantity: Bytes as a Kubernetes quantity (``K8S_MEMORY`` of the config schema).
        factor: Ranks per pod (count, at least 1).

    Returns:
        The product, in the unit of ``quantity``.

    Raises:
        ValueError: ``quantity`` is not a memory quantity (the schema refuses those first).
    """
    match = _MEMORY.fullmatch(quantity)
    if match is None:
        raise ValueError(quantity)
    return _decimal_text(Decimal(match["number"]) * factor) + (match["unit"] or "")


@dataclass(frozen=True)
class RankPod:
    """One participant's rank group as a substrate runs it: ``nodes`` identical pods.

    Attributes:
        participant_id: The participant.
        layout: Its rank layout (``federation.ranks`` with its own overrides).
        cpu: CPU of one pod (Kubernetes quantity): ``processes_per_node`` x the per-rank CPU.
        memory: Memory of one pod (Kubernetes quantity): ``processes_per_node`` x per rank.
        gpus: NVIDIA GPUs of one pod (count): the configured count, at least one per rank
            with nccl.
        shm_mib: Shared memory of one pod (MiB), :data:`SHM_PER_RANK_MIB` per local rank.
    """

    participant_id: str
    layout: RankLayout
    cpu: str
    memory: str
    gpus: int
    shm_mib: int

    @property
    def nodes(self) -> int:
        """Pods (hosts) of the group (count)."""
        return self.layout.nodes

    @property
    def ranks_per_pod(self) -> int:
        """Ranks one pod runs (count)."""
        return self.layout.processes_per_node

    @property
    def world_size(self) -> int:
        """Ranks of the whole group (count)."""
        return self.layout.world_size

    @property
    def multi_rank(self) -> bool:
        """Whether the participant runs more than one rank."""
        return self.layout.world_size > 1


def rank_pod(config: LensembleConfig, participant_id: str) -> RankPod:
    """The pod (container) one node of a participant's rank group needs.

    A participant with one rank gets exactly ``deployment.resources.participant``.

    Raises:
        KeyError: No participant has that id.
    """
    layout = config.rank_layout(participant_id)
    per_rank = config.deployment.resources.participant
    ranks = layout.processes_per_node
    gpus = max(per_rank.gpu, ranks) if layout.backend == "nccl" else per_rank.gpu
    return RankPod(
        participant_id=participant_id,
        layout=layout,
        cpu=scale_cpu(per_rank.cpu, ranks),
        memory=scale_memory(per_rank.memory, ranks),
        gpus=gpus,
        shm_mib=SHM_PER_RANK_MIB * ranks,
    )


def rank_pods(config: LensembleConfig) -> dict[str, RankPod]:
    """:func:`rank_pod` of every participant, by id in canonical (sorted) order."""
    return {pid: rank_pod(config, pid) for pid in config.participant_ids}


def layout_field(config: LensembleConfig, participant_id: str, field: str) -> str:
    """Dotted config path that sets ``field`` of a participant's layout, for error messages.

    Returns:
        ``federation.participants[i].ranks.<field>`` when the participant overrides it, else
        ``federation.ranks.<field>``.

    Raises:
        KeyError: No participant has that id.
    """
    for i, p in enumerate(config.federation.participants):
        if p.id == participant_id:
            if p.ranks is not None and getattr(p.ranks, field) is not None:
                return f"federation.participants[{i}].ranks.{field}"
            return f"federation.ranks.{field}"
    raise KeyError(participant_id)
