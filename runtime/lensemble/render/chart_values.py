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

from pydantic import Field, StringConstraints

from lensemble.config.schema import (
    DNS1123_LABEL,
    K8S_MEMORY,
    UNPINNED_TAG,
    UNPINNED_TAG_ALLOWED_IN,
    LensembleConfig,
    Toleration,
)
from lensemble.config.schema_export import DRAFT_2020_12
from lensemble.render.container import POD_TLS_DIR, pod_contract, tls_paths
from lensemble.render.knobs import Knobs as _Knobs
from lensemble.render.names import CONFIDENTIAL_LABEL, MAX_OBJECT_NAME
from lensemble.render.network_policy_values import (
    CIDR_PATTERN,
    OPEN_CIDRS,
    DNSIPBlock,
    DNSValues,
    IPBlock,
    LabelSelector,
    NamespaceSelector,
    NetworkPolicyValues,
    Peer,
    checked_cidr,
)

#: Helm carries every number as a float64: integers above this lose precision.
HELM_MAX_SAFE_INT = 2**53 - 1

Mode = Literal["all", "coordinator", "participant"]
MODES: tuple[str, ...] = ("all", "coordinator", "participant")
#: Re-exported: the network policy knobs live in lensemble.render.network_policy_values.
__all__ = [
    "CIDR_PATTERN",
    "HELM_MAX_SAFE_INT",
    "MODES",
    "OPEN_CIDRS",
    "ChartValues",
    "DNSIPBlock",
    "DNSValues",
    "IPBlock",
    "LabelSelector",
    "NamespaceSelector",
    "NetworkPolicyValues",
    "Peer",
    "checked_cidr",
    "config_rules",
    "values_schema",
    "values_schema_text",
]

K8S_QUANTITY = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[KMGTPE]i?|[mnuk])?$"
Quantity = Annotated[str, StringConstraints(pattern=K8S_QUANTITY)] | Annotated[int, Field(ge=0)]
DURATION = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"


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


class ServiceMonitorValues(_Knobs):
    """Prometheus Operator ServiceMonitors for every process's metrics port."""

    enabled: bool = Field(False, description="Render ServiceMonitors (needs the CRD).")
    interval: str = Field("30s", pattern=DURATION, description="Scrape interval (duration).")
    labels: dict[str, str] = Field(
        default_factory=dict, description="Extra labels, e.g. the Prometheus release selector."
    )


class PrometheusRuleValues(_Knobs):
    """A Prometheus Operator PrometheusRule with Lensemble's alert rules (docs/operations.md)."""

    enabled: bool = Field(False, description="Render the PrometheusRule (needs the CRD).")
    labels: dict[str, str] = Field(
        default_factory=dict, description="Extra labels, e.g. the Prometheus rule selector."
    )


class GrafanaDashboardValues(_Knobs):
    """The Grafana dashboard as a ConfigMap that Grafana's dashboard sidecar loads."""

    enabled: bool = Field(False, description="Render the dashboard ConfigMap.")
    labels: dict[str, str] = Field(
        default_factory=lambda: {"grafana_dashboard": "1"},
        description="Labels the sidecar selects ConfigMaps by (its default: grafana_dashboard).",
    )
    annotations: dict[str, str] = Field(
        default_factory=dict, description="Annotations, e.g. the sidecar's target folder."
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
    ca_bundle_secret: str = Field(
        "",
        description="Existing Secret, in every namespace of the release, whose ca.crt is the "
        "federation's CA bundle: when set, every identity's ca.crt comes from it instead of "
        "its own Secret (for federation.aggregation: masking when organisations' CAs differ).",
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


class RunRecordValues(_Knobs):
    """The key the coordinator signs its run record with (docs/run-record.md); one at most."""

    kms_key_id: str = Field(
        "",
        max_length=2048,
        description="AWS KMS HMAC_256 key (ARN or alias) as LENSEMBLE_LEDGER_KMS_KEY_ID; the "
        "Pulumi program sets it in sovereign-prod. Empty: no KMS signing.",
    )
    key_secret: str = Field(
        "",
        pattern=r"^$|^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        max_length=253,
        description="Secret in the coordinator's namespace whose `key` entry (32+ bytes) is "
        "the HMAC key, mounted as LENSEMBLE_LEDGER_KEY_FILE. Empty: no HMAC signing.",
    )


class CoordinatorValues(_Knobs):
    """Coordinator placement and Service."""

    service: ServiceValues = Field(default_factory=ServiceValues)
    run_record: RunRecordValues = Field(default_factory=RunRecordValues)
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
    """All-or-nothing admission of one participant's pods, never across participants.

    Empty fields take ``config.deployment.gang_scheduling``.
    """

    scheduler: Literal["", "none", "kueue", "volcano"] = Field(
        "",
        description="Batch scheduler; empty uses config.deployment.gang_scheduling.scheduler. "
        "Applies to a participant whose ranks span several nodes (its pod group) and to a "
        "participant pod asking for several GPUs.",
    )
    queue: str = Field(
        "",
        description="Kueue LocalQueue or Volcano queue name; empty uses "
        "config.deployment.gang_scheduling.queue.",
    )


class RankGroupValues(_Knobs):
    """One participant as its own StatefulSet: ``nodes`` pods of ``processesPerNode`` ranks.

    Computed from the config by ``lensemble render helm-values``
    (:mod:`lensemble.render.ranks`); the chart computes nothing itself.
    """

    name: str = Field(
        ...,
        pattern=DNS1123_LABEL,
        max_length=MAX_OBJECT_NAME,
        description="StatefulSet and headless rendezvous Service of the participant.",
    )
    trust_domain: str = Field(..., pattern=DNS1123_LABEL, description="Its trust domain.")
    nodes: int = Field(..., ge=1, le=64, description="Pods of the group (count).")
    processes_per_node: int = Field(..., ge=1, le=64, description="Ranks per pod (count).")
    rendezvous_port: int = Field(..., ge=1, le=65535, description="c10d rendezvous TCP port.")
    rendezvous_host: str = Field(
        ..., description="DNS name of node rank 0's pod (through the headless Service)."
    )
    cpu: str = Field(..., pattern=K8S_QUANTITY, description="CPU request of one pod.")
    memory: str = Field(..., pattern=K8S_MEMORY, description="Memory of one pod.")
    gpus: int = Field(..., ge=0, le=64, description="NVIDIA GPUs of one pod (count).")
    shm_mib: int = Field(..., ge=1, description="Shared memory (/dev/shm) of one pod (MiB).")


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
    prometheus_rule: PrometheusRuleValues = Field(default_factory=PrometheusRuleValues)
    grafana_dashboard: GrafanaDashboardValues = Field(default_factory=GrafanaDashboardValues)
    pod_security: PodSecurityValues = Field(default_factory=PodSecurityValues)
    tls: TLSValues = Field(default_factory=TLSValues)
    coordinator: CoordinatorValues = Field(default_factory=CoordinatorValues)
    participant: ParticipantValues = Field(default_factory=ParticipantValues)
    gang_scheduling: GangSchedulingValues = Field(default_factory=GangSchedulingValues)
    rank_groups: dict[str, RankGroupValues] = Field(
        default_factory=dict,
        description="Per participant id: its own StatefulSet. Every participant of a trust "
        "domain with a multi-rank participant (lensemble render helm-values fills it).",
    )
    tests: HelmTestValues = Field(default_factory=HelmTestValues)
    config: LensembleConfig = Field(
        ..., description="The LensembleConfig, fully resolved (lensemble render helm-values)."
    )


def _not_latest() -> dict[str, Any]:
    # The knob's side of the config rule "pinned-tag" (lensemble.config.rules), which covers
    # config.deployment.image.tag in the config's own schema.
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
        "then": {"properties": {"image": _not_latest()}},
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


def _at(path: str, schema: dict[str, Any]) -> dict[str, Any]:
    """A schema requiring the value at dotted ``path`` and applying ``schema`` to it."""
    node = schema
    for key in reversed(path.split(".")):
        node = {"properties": {key: node}, "required": [key]}
    return node


def _when(condition: dict[str, Any], *then: dict[str, Any]) -> dict[str, Any]:
    return {"if": condition, "then": {"allOf": list(then)}}


def config_rules() -> list[dict[str, Any]]:
    """What a pod needs beyond a valid config, as JSON Schema over ``config`` (``allOf``).

    The container contract: :func:`~lensemble.render.container.pod_contract` and the TLS paths a
    pod mounts. The config's own cross-field rules are in the config's schema, which the values
    schema embeds (:func:`lensemble.config.rules.json_schemas`), and in the chart's generated
    ``templates/_rules.tpl``.
    """
    tls = {field: {"const": path} for field, path in tls_paths(POD_TLS_DIR).items()}
    return [
        *(_at(path, {"const": value}) for path, value in pod_contract().items()),
        _when(
            _at("network.tls.enabled", {"const": True}),
            _at("network.tls", {"properties": tls, "required": sorted(tls)}),
        ),
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
    schema["properties"]["config"]["allOf"] = config_rules()
    # In a pod the contract's values are the only valid ones: make them the defaults editors show.
    for path, value in pod_contract().items():
        node = defs["LensembleConfig"]
        for key in path.split("."):
            spec = node["properties"][key]
            node = defs[spec["$ref"].rsplit("/", 1)[-1]] if "$ref" in spec else spec
        node["default"] = value
    return {
        "$schema": DRAFT_2020_12,
        "$id": "https://lensemble.dev/schema/lensemble-chart-values-v1.json",
        **schema,
        "allOf": _RULES,
    }


def values_schema_text() -> str:
    """The exact text committed to ``charts/lensemble/values.schema.json``."""
    return json.dumps(values_schema(), indent=2) + "\n"
