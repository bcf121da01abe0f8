"""Names shared by the Pulumi program and the chart: namespaces, service accounts, labels.

They follow ``deployment.namespace`` in the config: with ``per-trust-domain`` the coordinator
runs in ``<name>`` and each trust domain in ``<name>-<trust_domain>``; with ``single`` everything
runs in ``<name>``.
"""

from __future__ import annotations

from lensemble.config import LensembleConfig

#: Node label and taint key that pins a trust domain's pods to its own node group.
TRUST_DOMAIN_LABEL = "lensemble.dev/trust-domain"
#: Node label naming the node group's purpose (system, coordinator, participant).
POOL_LABEL = "lensemble.dev/pool"
#: Node label set on confidential-compute nodes.
CONFIDENTIAL_LABEL = "lensemble.dev/confidential-compute"


def coordinator_namespace(config: LensembleConfig) -> str:
    """Namespace of the coordinator."""
    return config.deployment.namespace.name


def participant_namespace(config: LensembleConfig, trust_domain: str) -> str:
    """Namespace of one trust domain's participants."""
    namespace = config.deployment.namespace
    if namespace.strategy == "per-trust-domain":
        return f"{namespace.name}-{trust_domain}"
    return namespace.name


def participant_service_account(config: LensembleConfig, trust_domain: str) -> str:
    """Service account of one trust domain's participant pods (its cloud identity)."""
    return f"{config.run.name}-{trust_domain}"
