"""Names the Pulumi program shares with the chart: namespaces, service accounts, Secrets, labels.

Namespaces come from ``lensemble.render.helm_values`` itself; the rest restates the chart's
``_helpers.tpl`` (``lensemble.participantName``, ``lensemble.tlsSecret``), because a Pod
Identity association or a TLS Secret made here must name exactly what the chart's pods use.
"""

from __future__ import annotations

import hashlib

from lensemble.config import LensembleConfig
from lensemble.render.helm_values import (
    coordinator_namespace,
    coordinator_service,
    participant_namespace,
)

__all__ = [
    "CONFIDENTIAL_LABEL",
    "POOL_LABEL",
    "TEE_LABEL",
    "TRUST_DOMAIN_LABEL",
    "coordinator_namespace",
    "coordinator_service",
    "namespace_labels",
    "participant_namespace",
    "participant_service_account",
    "safe_name",
    "tls_secret_name",
]

#: Node label and taint key that pins a trust domain's pods to its own node group.
TRUST_DOMAIN_LABEL = "lensemble.dev/trust-domain"
#: Node label naming the node group's purpose (system, coordinator, participant).
POOL_LABEL = "lensemble.dev/pool"
#: Node label and taint key of the confidential-compute pool (the chart's
#: ``coordinator.confidentialNodeSelector`` and ``confidentialTolerations``).
CONFIDENTIAL_LABEL = "lensemble.dev/confidential-compute"
#: Node label naming the trusted execution environment of confidential nodes.
TEE_LABEL = "lensemble.dev/tee"
#: Longest object name the chart keeps as is (StatefulSet pods add a revision hash).
MAX_NAME = 52


def namespace_labels(config: LensembleConfig, trust_domain: str | None = None) -> dict[str, str]:
    """Labels of a namespace Pulumi makes.

    The chart's Pod Security Admission ``restricted`` profile (enforce, audit, warn), the run,
    and the trust domain when the namespace has one.
    """
    labels = {
        "app.kubernetes.io/part-of": "lensemble",
        "lensemble.dev/run": config.run.name,
        **{
            f"pod-security.kubernetes.io/{mode}": "restricted"
            for mode in ("enforce", "audit", "warn")
        },
    }
    if trust_domain is not None:
        labels[TRUST_DOMAIN_LABEL] = trust_domain
    return labels


def safe_name(name: str) -> str:
    """The chart's ``lensemble.safeName``: names over 52 characters become 43 + ``-`` + 8 hex."""
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[:43].removesuffix('-')}-{digest}"


def participant_service_account(config: LensembleConfig, trust_domain: str) -> str:
    """Service account of one trust domain's participant pods (the chart's participantName)."""
    return safe_name(f"{config.run.name}-{trust_domain}")


def tls_secret_name(config: LensembleConfig, identity: str) -> str:
    """Default name of an identity's TLS Secret: ``<run.name>-<identity>-tls``."""
    return f"{config.run.name}-{identity}-tls"
