"""The ``deployment`` section: environment, image, resources, placement, storage, cloud."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from lensemble.config.sections import (
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    K8S_CPU,
    K8S_MEMORY,
    Environment,
    _Section,
)


# -------------------------------------------------------------------------------- deployment
class ImageConfig(_Section):
    """Container image every role runs (one image; the role is chosen at run time)."""

    repository: str = Field(
        "ghcr.io/lensemble/lensemble", min_length=1, description="Image repository."
    )
    tag: str = Field(
        "0.1.0-cpu",
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$",
        description="Image tag: '<version>-cpu' or '<version>-cu126' etc., or 'sha-<7 hex>'.",
    )
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Kubernetes imagePullPolicy."
    )


class RoleResources(_Section):
    """Requests and limits of one role's container."""

    cpu: str = Field("1", pattern=K8S_CPU, description="CPU cores (Kubernetes quantity).")
    memory: str = Field(
        "2Gi", pattern=K8S_MEMORY, description="Memory (Kubernetes quantity, bytes)."
    )
    gpu: int = Field(0, ge=0, le=64, description="NVIDIA GPUs (count).")


class ResourcesConfig(_Section):
    """Per-role resources."""

    coordinator: RoleResources = Field(default_factory=RoleResources)
    participant: RoleResources = Field(default_factory=RoleResources)


class NamespaceConfig(_Section):
    """Kubernetes namespace layout."""

    strategy: Literal["single", "per-trust-domain"] = Field(
        "single",
        description="'single': everything in one namespace; 'per-trust-domain': the "
        "coordinator in '<name>' and each trust domain in '<name>-<trust_domain>'.",
    )
    name: str = Field(
        "lensemble",
        pattern=DNS1123_LABEL,
        max_length=30,
        description="Namespace name (or prefix).",
    )


class Toleration(_Section):
    """A Kubernetes toleration."""

    key: str = Field(..., min_length=1, description="Taint key.")
    operator: Literal["Equal", "Exists"] = Field("Equal", description="Match operator.")
    value: str | None = Field(None, description="Taint value (with operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect."
    )


class TrustDomainPlacement(_Section):
    """Where one trust domain's pods may run."""

    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the trust domain's pods require."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Taints the trust domain's pods tolerate."
    )


class StorageConfig(_Section):
    """Volumes: participants' private data, and the coordinator's state."""

    class_name: str | None = Field(
        None, description="StorageClass of participant data volumes; null uses the default."
    )
    size: str = Field("1Gi", pattern=K8S_MEMORY, description="Volume size (Kubernetes quantity).")
    coordinator_size: str | None = Field(
        None,
        pattern=K8S_MEMORY,
        description="Coordinator state volume (checkpoints, ledger; Kubernetes quantity); null "
        "derives it from the model size and the 3 checkpoints kept (docs/run-record.md).",
    )


class CloudConfig(_Section):
    """Cloud account layout for the Pulumi stacks."""

    provider: Literal["aws"] = Field("aws", description="Cloud provider.")
    partition: Literal["aws", "aws-eusc", "aws-us-gov", "aws-cn"] = Field(
        "aws", description="AWS partition; ARNs are built from it."
    )
    region: str = Field(
        "eu-central-1",
        pattern=r"^[a-z]{2,4}(-[a-z0-9]+)+$",
        description="Region of the coordinator and shared resources.",
    )


class GangSchedulingConfig(_Section):
    """All-or-nothing admission of one participant's pods on Kubernetes, never of several.

    Off by default. It applies to a participant whose ranks span several nodes (its pod group:
    all ``nodes`` pods or none) and to a single participant pod asking for several GPUs.
    Participants are never grouped together: the outer loop is elastic and commits a round
    with a quorum.
    """

    scheduler: Literal["none", "kueue", "volcano"] = Field(
        "none",
        description="Batch scheduler that admits a participant's pods together: none, kueue "
        "(pod-group labels; Kueue's pod integration) or volcano (a PodGroup per participant).",
    )
    queue: str = Field(
        "",
        pattern=r"^$|" + DNS1123_SUBDOMAIN,
        max_length=253,
        description="Kueue LocalQueue (required with kueue) or Volcano queue (default "
        "'default') the participants' pods are admitted through.",
    )


class DeploymentConfig(_Section):
    """How the run is deployed: environment, image, resources, placement, cloud."""

    environment: Environment = Field(
        "local", description="Target environment: local, staging or sovereign-prod."
    )
    image: ImageConfig = Field(default_factory=ImageConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    namespace: NamespaceConfig = Field(default_factory=NamespaceConfig)
    trust_domains: dict[str, TrustDomainPlacement] = Field(
        default_factory=dict,
        description="Node placement per trust domain (keys are trust domain names).",
    )
    storage: StorageConfig = Field(default_factory=StorageConfig)
    gang_scheduling: GangSchedulingConfig = Field(default_factory=GangSchedulingConfig)
    confidential_compute: bool = Field(
        False,
        description="Run the coordinator on a confidential-compute node pool (AMD SEV-SNP).",
    )
    confidential_runtime_class: str | None = Field(
        None, description="RuntimeClass for the coordinator pod on confidential nodes, if any."
    )
    kube_context: str | None = Field(
        None, description="kubeconfig context of an existing cluster (local kind stacks)."
    )
    cloud: CloudConfig = Field(default_factory=CloudConfig)
