"""How big each trust domain's node group is, from the config's rank layouts.

Every participant pod of a trust domain needs the CPU, memory and GPUs of its rank layout
(:func:`lensemble.render.ranks.rank_pod`: ``processes_per_node`` times the per-rank resources,
one GPU per rank with nccl). The pods of one multi-node participant each need a node of their own
(the chart keeps them apart), other pods of the trust domain may share nodes. The node group takes
the smallest instance type of the table that holds the largest pod after what the node keeps for
itself, from a GPU family when any pod asks for GPUs, and as many nodes as the pods need.

The stack settings ``participantInstanceType`` and ``participantNodes`` still win when given,
provided they hold the pods; a setting too small for the config is refused naming the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

from lensemble.config import LensembleConfig
from lensemble.errors import ConfigError, ConfigProblem
from lensemble.render.ranks import RankPod, rank_pod

#: Instance type the program uses when the stack names none and the pods fit it.
DEFAULT_CPU_INSTANCE = "m6i.xlarge"
#: What a node keeps for the kubelet, the container runtime and the DaemonSets (an estimate of
#: EKS's reservations: cores and GiB).
NODE_RESERVED_CPU = Decimal("0.5")
NODE_RESERVED_MEMORY_GIB = Decimal("1.5")


@dataclass(frozen=True)
class InstanceType:
    """One EC2 instance type: vCPUs (count), memory (GiB) and NVIDIA GPUs (count)."""

    name: str
    vcpus: int
    memory_gib: int
    gpus: int = 0

    def holds(self, pod: RankPod) -> bool:
        """Whether one ``pod`` fits on a node of this type after the node's reservations."""
        return (
            cpu_cores(pod.cpu) <= self.vcpus - NODE_RESERVED_CPU
            and memory_gib(pod.memory) <= self.memory_gib - NODE_RESERVED_MEMORY_GIB
            and pod.gpus <= self.gpus
        )

    def pods_per_node(self, pod: RankPod) -> int:
        """How many pods like ``pod`` one node of this type runs (count, at least 0)."""
        limits = [
            (self.vcpus - NODE_RESERVED_CPU) / max(cpu_cores(pod.cpu), Decimal("0.001")),
            (self.memory_gib - NODE_RESERVED_MEMORY_GIB)
            / max(memory_gib(pod.memory), Decimal(1) / 1024),
        ]
        if pod.gpus:
            limits.append(Decimal(self.gpus) / pod.gpus)
        return max(0, math.floor(min(limits)))


#: General-purpose instance types, smallest first.
CPU_INSTANCES: tuple[InstanceType, ...] = (
    InstanceType("m6i.large", 2, 8),
    InstanceType("m6i.xlarge", 4, 16),
    InstanceType("m6i.2xlarge", 8, 32),
    InstanceType("m6i.4xlarge", 16, 64),
    InstanceType("m6i.8xlarge", 32, 128),
    InstanceType("m6i.12xlarge", 48, 192),
    InstanceType("m6i.16xlarge", 64, 256),
    InstanceType("m6i.24xlarge", 96, 384),
    InstanceType("m6i.32xlarge", 128, 512),
)
#: NVIDIA GPU instance types (A10G), fewest GPUs then smallest first.
GPU_INSTANCES: tuple[InstanceType, ...] = (
    InstanceType("g5.xlarge", 4, 16, 1),
    InstanceType("g5.2xlarge", 8, 32, 1),
    InstanceType("g5.4xlarge", 16, 64, 1),
    InstanceType("g5.8xlarge", 32, 128, 1),
    InstanceType("g5.16xlarge", 64, 256, 1),
    InstanceType("g5.12xlarge", 48, 192, 4),
    InstanceType("g5.24xlarge", 96, 384, 4),
    InstanceType("g5.48xlarge", 192, 768, 8),
)
KNOWN_INSTANCES = {t.name: t for t in (*CPU_INSTANCES, *GPU_INSTANCES)}

_MEMORY_UNITS = {
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "K": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
}


def cpu_cores(quantity: str) -> Decimal:
    """A Kubernetes CPU quantity in cores: ``"1500m"`` -> 1.5."""
    return Decimal(quantity[:-1]) / 1000 if quantity.endswith("m") else Decimal(quantity)


def memory_gib(quantity: str) -> Decimal:
    """A Kubernetes memory quantity in GiB: ``"3Gi"`` -> 3, ``"512Mi"`` -> 0.5."""
    for unit in sorted(_MEMORY_UNITS, key=len, reverse=True):
        if quantity.endswith(unit):
            return Decimal(quantity[: -len(unit)]) * _MEMORY_UNITS[unit] / 2**30
    return Decimal(quantity) / 2**30


@dataclass(frozen=True)
class NodeGroupSize:
    """One trust domain's node group.

    Attributes:
        instance_type: EC2 instance type of its nodes.
        nodes: Nodes (count).
        gpu: Whether its pods ask for GPUs (the group then runs the NVIDIA AMI).
    """

    instance_type: str
    nodes: int
    gpu: bool


def _problem(stack: str, key: str, message: str) -> ConfigError:
    return ConfigError([ConfigProblem(f"lensemble:{key}", message, source=f"Pulumi.{stack}.yaml")])


def _sized_instance(pods: list[RankPod], trust_domain: str, need: str) -> InstanceType:
    """The instance type sized from the config.

    The default type when it holds every pod, else the smallest of the table (GPU types when
    any pod asks for GPUs) that does.

    Raises:
        ConfigError: No instance type of the table holds the largest pod.
    """
    gpu = any(pod.gpus for pod in pods)
    default = KNOWN_INSTANCES[DEFAULT_CPU_INSTANCE]
    if not gpu and all(default.holds(pod) for pod in pods):
        return default
    table = GPU_INSTANCES if gpu else CPU_INSTANCES
    fitting = [t for t in table if all(t.holds(pod) for pod in pods)]
    if fitting:
        return fitting[0]
    raise ConfigError(
        [
            ConfigProblem(
                "deployment.resources.participant",
                f"participants of trust domain '{trust_domain}' need {need}, more "
                f"than the largest instance type ({table[-1].name}); lower "
                "processes_per_node (more nodes instead) or the per-rank resources.",
            )
        ]
    )


def _given_instance(
    pods: list[RankPod], trust_domain: str, need: str, instance_type: str, stack: str
) -> InstanceType:
    """The stack's ``participantInstanceType`` (an unknown type is taken on trust).

    Raises:
        ConfigError: A known type too small for the pods.
    """
    chosen = KNOWN_INSTANCES.get(instance_type, InstanceType(instance_type, 0, 0))
    if instance_type in KNOWN_INSTANCES and not all(chosen.holds(pod) for pod in pods):
        raise _problem(
            stack,
            "participantInstanceType",
            f"{instance_type} cannot hold the pods of trust domain '{trust_domain}' "
            f"({need}); remove the setting to size the node group from the config, or "
            "choose a larger type.",
        )
    return chosen


def node_group_size(
    config: LensembleConfig,
    trust_domain: str,
    *,
    stack: str,
    instance_type: str | None = None,
    nodes: int | None = None,
) -> NodeGroupSize:
    """The node group one trust domain's participant pods need.

    Args:
        config: The validated config (rank layouts and ``deployment.resources.participant``).
        trust_domain: The trust domain.
        stack: Stack name, for error messages.
        instance_type: ``participantInstanceType`` of the stack, or None to size from the config.
        nodes: ``participantNodes`` of the stack, or None to size from the config.

    Returns:
        Instance type and node count; a stack setting when given, else the sized one.

    Raises:
        ConfigError: No instance type of the table holds the largest pod, or a stack setting
            is too small for the pods (naming the key and the size needed).
    """
    pods = [
        rank_pod(config, p.id)
        for p in config.federation.participants
        if p.trust_domain == trust_domain
    ]
    largest_group = max(pod.nodes for pod in pods)
    biggest = max(pods, key=lambda pod: (pod.gpus, cpu_cores(pod.cpu), memory_gib(pod.memory)))
    need = f"{biggest.cpu} CPU, {biggest.memory} memory and {biggest.gpus} GPU(s) per pod"
    if instance_type is None:
        chosen = _sized_instance(pods, trust_domain, need)
    else:
        chosen = _given_instance(pods, trust_domain, need, instance_type, stack)
    per_node = chosen.pods_per_node(biggest) if chosen.vcpus else 1
    needed = max(largest_group, math.ceil(sum(pod.nodes for pod in pods) / max(per_node, 1)))
    if nodes is not None and nodes < needed:
        raise _problem(
            stack,
            "participantNodes",
            f"{nodes} node(s) cannot run the {sum(pod.nodes for pod in pods)} participant "
            f"pod(s) of trust domain '{trust_domain}' (a participant on {largest_group} nodes "
            f"needs that many); give at least {needed} or remove the setting.",
        )
    gpu = any(pod.gpus for pod in pods)
    return NodeGroupSize(instance_type=instance_type or chosen.name, nodes=nodes or needed, gpu=gpu)
