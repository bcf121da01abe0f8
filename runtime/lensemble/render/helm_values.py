"""Helm values for ``charts/lensemble`` rendered from one :class:`LensembleConfig`.

The values hold the config itself under ``config:`` (the chart mounts it read-only at
``/etc/lensemble/config.yaml``) plus the few chart knobs that follow from the config and the
install mode. Every other knob keeps the chart default, which takes its value from the config.

The mounted config is the *container view* of the source config: the same federation, with the
fields that describe where a process runs rewritten for a pod (``docs/architecture.md``). Only
fields the config hash leaves out change, so the hash a pod reports equals the source config's.
"""

from __future__ import annotations

from typing import Any

from lensemble.config.schema import LensembleConfig
from lensemble.config.sizing import coordinator_volume_size
from lensemble.errors import ConfigError, ConfigProblem, UsageError
from lensemble.render.chart_values import HELM_MAX_SAFE_INT, MODES
from lensemble.render.container import POD_TLS_DIR, container_config
from lensemble.render.names import (
    COORDINATOR,
    coordinator_name,
    coordinator_namespace,
    coordinator_service,
    participant_name,
    participant_namespace,
    rank_group_name,
    tls_secret_name,
)
from lensemble.render.ranks import rank_pods

#: Hosts a participant in another pod cannot dial: rewritten to the coordinator's Service.
_LOOPBACK = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}  # noqa: S104


def participants_by_trust_domain(config: LensembleConfig) -> dict[str, list[str]]:
    """Participant ids per trust domain, in config order (the StatefulSet ordinal order).

    Returns:
        Trust domain -> participant ids; pod ``<statefulset>-<i>`` of a trust domain is its
        i-th participant (``docs/architecture.md``, participant identity).
    """
    out: dict[str, list[str]] = {}
    for p in config.federation.participants:
        out.setdefault(p.trust_domain, []).append(p.id)
    return dict(sorted(out.items()))


def pod_config(config: LensembleConfig) -> LensembleConfig:
    """The config as a pod reads it (:func:`~lensemble.render.container.container_config`).

    A loopback ``network.host`` becomes the coordinator's Service; the TLS paths are
    ``/etc/lensemble/tls/{identity}/...`` (one Secret per identity, as ``lensemble certs init``
    and cert-manager lay them out).

    Raises:
        ConfigError: The config cannot run on Kubernetes: bearer-token auth (tokens would need
            a Secret per participant; use mtls), a participant or trust domain named
            'coordinator', a coordinator host participants in other namespaces cannot resolve,
            an integer Helm would round, or a rule of the network transport fails.
    """
    net = config.network
    if net.auth == "token":
        raise ConfigError(
            [
                ConfigProblem(
                    "network.auth",
                    "'token' is not supported on Kubernetes (tokens are for development "
                    "outside a cluster); use mtls, or insecure in local.",
                )
            ]
        )
    for i, p in enumerate(config.federation.participants):
        for field, value in (("id", p.id), ("trust_domain", p.trust_domain)):
            if value == COORDINATOR:
                raise ConfigError(
                    [
                        ConfigProblem(
                            f"federation.participants[{i}].{field}",
                            "'coordinator' names the coordinator's objects and certificate on "
                            "Kubernetes; choose another name.",
                        )
                    ]
                )
    host = net.host
    if host in _LOOPBACK:
        host = coordinator_service(config)
    elif config.deployment.namespace.strategy == "per-trust-domain" and "." not in host:
        raise ConfigError(
            [
                ConfigProblem(
                    "network.host",
                    f"'{host}' is a short name that participants in other namespaces cannot "
                    f"resolve; use '{coordinator_service(config)}' or a fully qualified name.",
                )
            ]
        )
    _check_float64_safe(config.model_dump(mode="json"), "")
    return container_config(config, coordinator_host=host, tls_dir=POD_TLS_DIR)


def _check_float64_safe(node: Any, path: str) -> None:
    """Refuse integers Helm would round (it stores numbers as float64)."""
    if isinstance(node, dict):
        for key, value in node.items():
            _check_float64_safe(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _check_float64_safe(value, f"{path}[{i}]")
    elif isinstance(node, int) and not isinstance(node, bool) and abs(node) > HELM_MAX_SAFE_INT:
        raise ConfigError(
            [
                ConfigProblem(
                    path,
                    f"{node} is above 2^53 - 1, which Helm cannot carry exactly (it stores "
                    "numbers as float64); choose a smaller value.",
                )
            ]
        )


def render_helm_values(
    config: LensembleConfig, *, mode: str = "all", trust_domain: str | None = None
) -> dict[str, Any]:
    """Helm values for ``charts/lensemble`` that deploy ``config``.

    Args:
        config: The validated source config.
        mode: ``all`` (coordinator and every participant), ``coordinator``, or ``participant``
            (one trust domain per release).
        trust_domain: The trust domain a ``participant`` release installs; required with that
            mode and refused with the others.

    Returns:
        JSON-ready values: ``mode``, ``trustDomain``, ``trustDomainIsolation`` (on in
        sovereign-prod), ``names`` (see :func:`object_names`), ``config`` (the container
        view, see :func:`pod_config`) and ``persistence.coordinator.size`` (derived from the
        model and checkpoint retention, or ``deployment.storage.coordinator_size``).
        Keys are in chart order; every other knob keeps its chart default.

    Raises:
        UsageError: An unknown mode, or a trust domain that is missing, unknown or not
            allowed with the mode.
        ConfigError: The config cannot run on Kubernetes (see :func:`pod_config`).
    """
    if mode not in MODES:
        raise UsageError(
            f"mode '{mode}' is not one of {', '.join(MODES)}.",
            remediation="Pass --mode all, coordinator or participant.",
        )
    domains = config.trust_domains
    if mode == "participant":
        if not trust_domain:
            raise UsageError(
                "mode 'participant' installs one trust domain, but none was given.",
                remediation=f"Pass --trust-domain with one of: {', '.join(domains)}.",
            )
        if trust_domain not in domains:
            raise UsageError(
                f"trust domain '{trust_domain}' is not the trust domain of any participant.",
                remediation=f"Use one of: {', '.join(domains)}.",
            )
    elif trust_domain:
        raise UsageError(
            f"--trust-domain only applies to mode 'participant', not '{mode}'.",
            remediation="Drop --trust-domain or pass --mode participant.",
        )
    view = pod_config(config)
    return {
        "mode": mode,
        "trustDomain": trust_domain or "",
        "trustDomainIsolation": config.deployment.environment == "sovereign-prod",
        "names": object_names(config),
        "config": view.model_dump(mode="json"),
        "persistence": {"coordinator": {"size": coordinator_volume_size(config)}},
        "rankGroups": rank_groups(config),
    }


def rank_groups(config: LensembleConfig) -> dict[str, Any]:
    """The chart's ``rankGroups:`` value: participants that run as their own StatefulSet.

    A trust domain with a multi-rank participant renders every one of its participants this
    way (``nodes`` pods of ``processes_per_node`` ranks each); the participant id then comes
    from the pod's environment, not from a shared StatefulSet's pod ordinal. Other trust
    domains keep their one StatefulSet.

    Returns:
        Participant id -> ``name``, ``trustDomain``, ``nodes``, ``processesPerNode``,
        ``rendezvousPort``, ``rendezvousHost`` (node rank 0's pod through the headless
        Service), ``cpu``, ``memory``, ``gpus`` and ``shmMib`` of one pod; empty when every
        participant has one rank.

    Raises:
        ConfigError: A group's name would be another trust domain's workload or the
            coordinator's.
    """
    pods = rank_pods(config)
    grouped = {p.trust_domain for p in config.federation.participants if pods[p.id].multi_rank}
    taken = {coordinator_name(config): "the coordinator"} | {
        participant_name(config, td): f"trust domain '{td}'"
        for td in config.trust_domains
        if td not in grouped
    }
    out: dict[str, Any] = {}
    for i, p in enumerate(config.federation.participants):
        if p.trust_domain not in grouped:
            continue
        name = rank_group_name(config, p.id)
        if name in taken:
            raise ConfigError(
                [
                    ConfigProblem(
                        f"federation.participants[{i}].id",
                        f"'{p.id}' runs as its own StatefulSet '{name}' (its trust domain has "
                        f"a multi-rank participant), which is already the name of "
                        f"{taken[name]}; rename the participant.",
                    )
                ]
            )
        taken[name] = f"participant '{p.id}'"
        pod = pods[p.id]
        namespace = participant_namespace(config, p.trust_domain)
        out[p.id] = {
            "name": name,
            "trustDomain": p.trust_domain,
            "nodes": pod.nodes,
            "processesPerNode": pod.ranks_per_pod,
            "rendezvousPort": pod.layout.rendezvous_port,
            "rendezvousHost": f"{name}-0.{name}.{namespace}.svc",
            "cpu": pod.cpu,
            "memory": pod.memory,
            "gpus": pod.gpus,
            "shmMib": pod.shm_mib,
        }
    return out


def object_names(config: LensembleConfig) -> dict[str, Any]:
    """The chart's ``names:`` value: every object name, from :mod:`lensemble.render.names`.

    Returns:
        ``coordinator`` and, per trust domain, ``participants.<td>`` (``name`` and
        ``namespace``), and ``tlsSecrets`` per identity.
    """
    identities = [COORDINATOR, *config.participant_ids]
    return {
        "coordinator": {
            "name": coordinator_name(config),
            "namespace": coordinator_namespace(config),
        },
        "participants": {
            td: {
                "name": participant_name(config, td),
                "namespace": participant_namespace(config, td),
            }
            for td in config.trust_domains
        },
        "tlsSecrets": {identity: tls_secret_name(config, identity) for identity in identities},
    }
