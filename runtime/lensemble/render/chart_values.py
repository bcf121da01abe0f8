"""The Helm chart's values as pydantic models, and the ``values.schema.json`` generated from them.

``config:`` is the :class:`~lensemble.config.LensembleConfig` itself; every other key is a chart
knob that only changes how the config is rendered on Kubernetes. Knobs that mirror a config field
(image, per-role resources, participant volume size) default to empty, meaning "take it from the
config", so the config stays the single source of truth.

The committed ``charts/lensemble/values.schema.json`` is :func:`values_schema_text`; a test fails
when it drifts. Helm v4 validates values against it (JSON Schema draft 2020-12) on ``install``,
``upgrade``, ``template`` and ``lint``. The approach follows the dagster chart, whose schema is also
generated from pydantic models.
"""

from __future__ import annotations

import copy
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel

from lensemble.config.schema import (
    DNS1123_LABEL,
    K8S_MEMORY,
    UNPINNED_TAG,
    UNPINNED_TAG_ALLOWED_IN,
    LensembleConfig,
    Toleration,
)
from lensemble.config.schema_export import DRAFT_2020_12
from lensemble.render.names import CONFIDENTIAL_LABEL, MAX_OBJECT_NAME

#: Helm carries every number as a float64: integers above this lose precision.
HELM_MAX_SAFE_INT = 2**53 - 1

Mode = Literal["all", "coordinator", "participant"]
MODES: tuple[str, ...] = ("all", "coordinator", "participant")

#: Address ranges that mean "anywhere": never a NetworkPolicy peer.
OPEN_CIDRS = ("0.0.0.0/0", "::/0")

K8S_QUANTITY = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[KMGTPE]i?|[mnuk])?$"
Quantity = Annotated[str, StringConstraints(pattern=K8S_QUANTITY)] | Annotated[int, Field(ge=0)]
DURATION = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"


class _Knobs(BaseModel):
    """Chart values use camelCase keys (Helm convention) and reject unknown keys."""

    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True
    )


class ImageValues(_Knobs):
    """Container image override; empty fields take ``config.deployment.image``."""

    repository: str = Field("", description="Image repository; empty uses the config's.")
    tag: str = Field(
        "",
        pattern=r"^$|^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$",
        description=f"Image tag; empty uses the config's. '{UNPINNED_TAG}' is refused outside "
        f"{UNPINNED_TAG_ALLOWED_IN}.",
    )
    pull_policy: Literal["", "Always", "IfNotPresent", "Never"] = Field(
        "", description="imagePullPolicy; empty uses the config's."
    )
    pull_secrets: list[str] = Field(
        default_factory=list, description="Names of imagePullSecrets in each namespace."
    )


class ResourceOverride(_Knobs):
    """A full Kubernetes ResourceRequirements; empty takes ``config.deployment.resources``."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict, description="Resource requests (Kubernetes quantities)."
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict, description="Resource limits (Kubernetes quantities)."
    )


class ResourcesValues(_Knobs):
    """Per-role resource overrides."""

    coordinator: ResourceOverride = Field(default_factory=ResourceOverride)
    participant: ResourceOverride = Field(default_factory=ResourceOverride)


class CoordinatorPersistence(_Knobs):
    """The coordinator's volume for checkpoints and the ledger."""

    enabled: bool = Field(
        True, description="Keep checkpoints and the ledger on a PVC (false: emptyDir)."
    )
    size: str = Field(
        "1Gi",
        pattern=K8S_MEMORY,
        description="PVC size (Kubernetes quantity); `lensemble render helm` sets it from the "
        "model size and checkpoint retention, or config.deployment.storage.coordinator_size.",
    )
    storage_class: str = Field("", description="StorageClass; empty uses the cluster default.")


class ParticipantPersistence(_Knobs):
    """Each participant's private data volume (a volumeClaimTemplate)."""

    size: str = Field(
        "",
        pattern=r"^$|" + K8S_MEMORY,
        description="Volume size; empty uses config.deployment.storage.size.",
    )
    storage_class: str = Field(
        "", description="StorageClass; empty uses config.deployment.storage.class_name."
    )


class PersistenceValues(_Knobs):
    """Volumes per role."""

    coordinator: CoordinatorPersistence = Field(default_factory=CoordinatorPersistence)
    participant: ParticipantPersistence = Field(default_factory=ParticipantPersistence)


class NamespacesValues(_Knobs):
    """Namespaces named by ``config.deployment.namespace``."""

    create: bool = Field(
        True, description="Create the namespaces with Pod Security Admission 'restricted' labels."
    )


class IPBlock(_Knobs):
    """A NetworkPolicy ipBlock; the whole internet is never a valid peer."""

    cidr: str = Field(
        ...,
        min_length=1,
        description="CIDR of the peer (never 0.0.0.0/0).",
        json_schema_extra={"not": {"enum": list(OPEN_CIDRS)}},
    )
    except_: list[str] = Field(
        default_factory=list, alias="except", description="CIDRs excluded from the block."
    )


class LabelSelector(_Knobs):
    """A Kubernetes label selector (matchLabels only)."""

    match_labels: dict[str, str] = Field(default_factory=dict, description="Labels to match.")


class Peer(_Knobs):
    """A NetworkPolicy peer outside this release (another cluster or namespace)."""

    ip_block: IPBlock | None = Field(None, description="Peer by address range.")
    namespace_selector: LabelSelector | None = Field(None, description="Peer by namespace.")
    pod_selector: LabelSelector | None = Field(None, description="Peer by pod labels.")


class DNSValues(_Knobs):
    """Where cluster DNS runs, so egress can allow exactly it."""

    namespace: str = Field("kube-system", pattern=DNS1123_LABEL, description="DNS namespace.")
    pod_labels: dict[str, str] = Field(
        default_factory=lambda: {"k8s-app": "kube-dns"}, description="Labels of the DNS pods."
    )


class NetworkPolicyValues(_Knobs):
    """Default-deny NetworkPolicies with explicit allowances."""

    enabled: bool = Field(True, description="Render the NetworkPolicies.")
    metrics_namespace: str = Field(
        "monitoring",
        pattern=DNS1123_LABEL,
        description="Namespace whose pods may scrape the metrics port.",
    )
    dns: DNSValues = Field(default_factory=DNSValues)
    coordinator_peers: list[Peer] = Field(
        default_factory=list,
        description="Extra egress peers for participants: the coordinator's address when it "
        "runs in another cluster (mode participant).",
    )
    participant_peers: list[Peer] = Field(
        default_factory=list,
        description="Extra ingress peers of the coordinator: participants in other clusters "
        "(mode coordinator).",
    )


class ServiceMonitorValues(_Knobs):
    """Prometheus Operator ServiceMonitors for every process's metrics port."""

    enabled: bool = Field(False, description="Render ServiceMonitors (needs the CRD).")
    interval: str = Field("30s", pattern=DURATION, description="Scrape interval (duration).")
    labels: dict[str, str] = Field(
        default_factory=dict, description="Extra labels, e.g. the Prometheus release selector."
    )


class PodSecurityValues(_Knobs):
    """Pod-level security context; containers are always hardened (restricted profile)."""

    run_as_user: int = Field(10001, ge=1, le=2**31 - 1, description="Non-root UID.")
    run_as_group: int = Field(10001, ge=1, le=2**31 - 1, description="Non-root GID.")
    fs_group: int = Field(10001, ge=1, le=2**31 - 1, description="Group owning the volumes.")


class IssuerRef(_Knobs):
    """The cert-manager issuer that signs every identity."""

    name: str = Field("", description="Issuer name (required with certManager.enabled).")
    kind: Literal["Issuer", "ClusterIssuer"] = Field("ClusterIssuer", description="Issuer kind.")
    group: str = Field("cert-manager.io", description="Issuer API group.")


class CertManagerValues(_Knobs):
    """cert-manager Certificates, one per identity, written to the identity's Secret."""

    enabled: bool = Field(False, description="Render cert-manager Certificate resources.")
    issuer_ref: IssuerRef = Field(default_factory=IssuerRef)
    duration: str = Field("2160h", pattern=DURATION, description="Certificate lifetime.")
    renew_before: str = Field("360h", pattern=DURATION, description="Renew this long before.")


class TLSValues(_Knobs):
    """Where each identity's TLS Secret comes from (never a ConfigMap)."""

    cert_manager: CertManagerValues = Field(default_factory=CertManagerValues)
    secret_names: dict[str, str] = Field(
        default_factory=dict,
        description="Existing Secret per identity ('coordinator' or a participant id); "
        "default '<run.name>-<identity>-tls'.",
    )


class ServiceValues(_Knobs):
    """The coordinator's Service."""

    type: Literal["ClusterIP", "LoadBalancer", "NodePort"] = Field(
        "ClusterIP", description="Service type; LoadBalancer for participants in other clusters."
    )
    annotations: dict[str, str] = Field(default_factory=dict, description="Service annotations.")


class PDBValues(_Knobs):
    """The coordinator's PodDisruptionBudget."""

    enabled: bool = Field(True, description="Refuse voluntary eviction of the coordinator.")


class CoordinatorValues(_Knobs):
    """Coordinator placement and Service."""

    service: ServiceValues = Field(default_factory=ServiceValues)
    pod_disruption_budget: PDBValues = Field(default_factory=PDBValues)
    node_selector: dict[str, str] = Field(default_factory=dict, description="Extra node labels.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Extra tolerations.")
    confidential_node_selector: dict[str, str] = Field(
        default_factory=lambda: {CONFIDENTIAL_LABEL: "true"},
        description="Node labels of the confidential-compute pool (with "
        "config.deployment.confidential_compute).",
    )
    confidential_tolerations: list[Toleration] = Field(
        default_factory=lambda: [
            Toleration(
                key=CONFIDENTIAL_LABEL,
                operator="Exists",
                effect="NoSchedule",
            )
        ],
        description="Tolerations for the confidential-compute pool's taints.",
    )
    pod_annotations: dict[str, str] = Field(default_factory=dict, description="Pod annotations.")


class ParticipantValues(_Knobs):
    """Participant pods."""

    pod_annotations: dict[str, str] = Field(default_factory=dict, description="Pod annotations.")


class GangSchedulingValues(_Knobs):
    """All-or-nothing admission inside one participant's pod, never across participants."""

    scheduler: Literal["none", "kueue", "volcano"] = Field(
        "none",
        description="Batch scheduler; applies only when a participant asks for several GPUs.",
    )
    queue: str = Field("", description="Kueue LocalQueue or Volcano queue name.")


class HelmTestValues(_Knobs):
    """The ``helm test`` hook."""

    enabled: bool = Field(True, description="Render the helm test pod (coordinator health).")


class WorkloadNames(_Knobs):
    """Name and namespace of one workload's objects."""

    name: str = Field(
        "",
        pattern=r"^$|" + DNS1123_LABEL,
        max_length=MAX_OBJECT_NAME,
        description="Name of the Deployment or StatefulSet, its Service and ServiceAccount.",
    )
    namespace: str = Field("", pattern=r"^$|" + DNS1123_LABEL, description="Its namespace.")


class ObjectNames(_Knobs):
    """Every object name the chart uses, computed by ``lensemble.render.names``.

    The chart computes no name itself: ``lensemble render helm-values`` writes these, so the
    chart, the Pulumi program and the kind cluster always agree.
    """

    coordinator: WorkloadNames = Field(default_factory=WorkloadNames)
    participants: dict[str, WorkloadNames] = Field(
        default_factory=dict, description="Per trust domain: its participants' workload."
    )
    tls_secrets: dict[str, str] = Field(
        default_factory=dict,
        description="Per identity ('coordinator' or a participant id): its TLS Secret "
        "(tls.secretNames overrides one).",
    )


class ChartValues(_Knobs):
    """Every value of ``charts/lensemble``.

    Attributes:
        config: The LensembleConfig the processes read (mounted as ``/etc/lensemble/config.yaml``).
    """

    mode: Mode = Field(
        "all",
        description="What this release installs: 'all' (coordinator and every participant), "
        "'coordinator', or 'participant' (the trust domain in trustDomain).",
    )
    trust_domain: str = Field(
        "",
        pattern=r"^$|" + DNS1123_LABEL,
        description="The trust domain a participant-mode release installs.",
    )
    trust_domain_isolation: bool = Field(
        False,
        description="Required pod anti-affinity: no node runs pods (or mounts volumes) of two "
        "trust domains, nor a participant next to the coordinator.",
    )
    names: ObjectNames = Field(default_factory=ObjectNames)
    image: ImageValues = Field(default_factory=ImageValues)
    resources: ResourcesValues = Field(default_factory=ResourcesValues)
    persistence: PersistenceValues = Field(default_factory=PersistenceValues)
    namespaces: NamespacesValues = Field(default_factory=NamespacesValues)
    network_policy: NetworkPolicyValues = Field(default_factory=NetworkPolicyValues)
    service_monitor: ServiceMonitorValues = Field(default_factory=ServiceMonitorValues)
    pod_security: PodSecurityValues = Field(default_factory=PodSecurityValues)
    tls: TLSValues = Field(default_factory=TLSValues)
    coordinator: CoordinatorValues = Field(default_factory=CoordinatorValues)
    participant: ParticipantValues = Field(default_factory=ParticipantValues)
    gang_scheduling: GangSchedulingValues = Field(default_factory=GangSchedulingValues)
    tests: HelmTestValues = Field(default_factory=HelmTestValues)
    config: LensembleConfig = Field(
        ..., description="The LensembleConfig, fully resolved (lensemble render helm-values)."
    )


def _not_latest() -> dict[str, Any]:
    # config.schema.unpinned_tag_refused, as JSON Schema (with the environment rule below).
    return {"properties": {"tag": {"not": {"const": UNPINNED_TAG}}}}


#: Cross-field rules Helm enforces before rendering (each names the offending field).
_RULES: list[dict[str, Any]] = [
    {
        "if": {"properties": {"mode": {"const": "participant"}}, "required": ["mode"]},
        "then": {"properties": {"trustDomain": {"minLength": 1}}, "required": ["trustDomain"]},
    },
    {
        "if": {
            "properties": {
                "config": {
                    "properties": {
                        "deployment": {
                            "properties": {
                                "environment": {"not": {"const": UNPINNED_TAG_ALLOWED_IN}}
                            },
                            "required": ["environment"],
                        }
                    },
                    "required": ["deployment"],
                }
            },
            "required": ["config"],
        },
        "then": {
            "properties": {
                "image": _not_latest(),
                "config": {"properties": {"deployment": {"properties": {"image": _not_latest()}}}},
            }
        },
    },
    {
        "if": {
            "properties": {
                "tls": {
                    "properties": {
                        "certManager": {
                            "properties": {"enabled": {"const": True}},
                            "required": ["enabled"],
                        }
                    },
                    "required": ["certManager"],
                }
            },
            "required": ["tls"],
        },
        "then": {
            "properties": {
                "tls": {
                    "properties": {
                        "certManager": {
                            "properties": {"issuerRef": {"properties": {"name": {"minLength": 1}}}}
                        }
                    }
                }
            }
        },
    },
]


def values_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of the chart values, for ``values.schema.json``.

    The config part is the config's own schema, with two changes Helm needs: the nested
    ``$id`` is dropped (it would re-base every ``$ref`` inside it) and ``run.root_seed`` is capped
    at 2^53 - 1 because Helm stores numbers as float64.

    Returns:
        The schema as a JSON-ready mapping.
    """
    schema = copy.deepcopy(ChartValues.model_json_schema(mode="validation", by_alias=True))
    defs = schema["$defs"]
    defs["LensembleConfig"].pop("$id", None)
    seed = defs["RunConfig"]["properties"]["root_seed"]
    seed.pop("exclusiveMaximum", None)
    seed["maximum"] = HELM_MAX_SAFE_INT
    # pydantic emits `required` only for fields without defaults; Helm must see the whole
    # resolved config (values.yaml has no default config), so a bare install is refused here.
    schema["properties"]["config"]["required"] = sorted(
        field.alias or name for name, field in LensembleConfig.model_fields.items()
    )
    return {
        "$schema": DRAFT_2020_12,
        "$id": "https://lensemble.dev/schema/lensemble-chart-values-v1.json",
        **schema,
        "allOf": _RULES,
    }


def values_schema_text() -> str:
    """The exact text committed to ``charts/lensemble/values.schema.json``."""
    return json.dumps(values_schema(), indent=2) + "\n"
