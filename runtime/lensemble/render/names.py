"""Names and label keys of the objects a config deploys, computed once for every renderer.

The chart (through the ``names:`` value ``lensemble render helm-values`` writes), the Pulumi
program (``infra/``), the kind cluster and the Kubernetes policy all name the same objects; only
this module computes the names. ``tests/k8s/test_names.py`` renders adversarial inputs (maximum
lengths, double hyphens, a hyphen exactly where a long name is cut) through Helm and requires
every rendered object to carry the name computed here.
"""

from __future__ import annotations

import hashlib

from lensemble.config.schema import LensembleConfig

#: Label (and node label, and taint key) naming the trust domain of an object or node.
TRUST_DOMAIN_LABEL = "lensemble.dev/trust-domain"
#: Label naming the run (``run.name``) on every object.
RUN_LABEL = "lensemble.dev/run"
#: Label naming an object's role (``coordinator`` or ``participant``).
COMPONENT_LABEL = "app.kubernetes.io/component"
#: Node label naming a node group's purpose (system, coordinator, participant).
POOL_LABEL = "lensemble.dev/pool"
#: Node label and taint key of the confidential-compute pool.
CONFIDENTIAL_LABEL = "lensemble.dev/confidential-compute"
#: Node label naming the trusted execution environment of confidential nodes.
TEE_LABEL = "lensemble.dev/tee"

#: Identity (TLS Secret, certificate, object-name suffix) of the coordinator.
COORDINATOR = "coordinator"
#: Longest object name kept as is: a StatefulSet's pods add a revision hash to its name, and
#: the label value that carries it stays within 63 characters.
MAX_OBJECT_NAME = 52
#: A longer name keeps this many leading characters, then ``-`` and :data:`DIGEST_CHARS` hex.
KEPT_PREFIX = 43
DIGEST_CHARS = 8


def safe_name(name: str) -> str:
    """A DNS-label-safe object name of at most :data:`MAX_OBJECT_NAME` characters.

    Args:
        name: The full name, e.g. ``<run.name>-<trust domain>`` (at most 71 characters).

    Returns:
        ``name`` when it is short enough; otherwise its first 43 characters less one trailing
        ``-`` (Go's ``trimSuffix``: one, not all), then ``-`` and the first 8 hex digits of the
        SHA-256 of the full name, so distinct long names stay distinct.
    """
    if len(name) <= MAX_OBJECT_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:DIGEST_CHARS]
    return f"{name[:KEPT_PREFIX].removesuffix('-')}-{digest}"


def coordinator_name(config: LensembleConfig) -> str:
    """Deployment, Service and ServiceAccount of the coordinator: ``<run.name>-coordinator``."""
    return f"{config.run.name}-{COORDINATOR}"


def participant_name(config: LensembleConfig, trust_domain: str) -> str:
    """StatefulSet, Service and ServiceAccount of one trust domain's participants.

    Returns:
        :func:`safe_name` of ``<run.name>-<trust_domain>``.
    """
    return safe_name(f"{config.run.name}-{trust_domain}")


def rank_group_name(config: LensembleConfig, participant_id: str) -> str:
    """StatefulSet and headless (rendezvous) Service of one participant's own pod group.

    A trust domain with a multi-rank participant runs each of its participants as its own
    StatefulSet (``docs/how-to/multi-rank-deployment.md``).

    Returns:
        :func:`safe_name` of ``<run.name>-<participant id>``.
    """
    return safe_name(f"{config.run.name}-{participant_id}")


def coordinator_namespace(config: LensembleConfig) -> str:
    """Namespace of the coordinator (``deployment.namespace.name``)."""
    return config.deployment.namespace.name


def participant_namespace(config: LensembleConfig, trust_domain: str) -> str:
    """Namespace of one trust domain's participants.

    Returns:
        ``<name>`` with the ``single`` strategy, ``<name>-<trust_domain>`` with
        ``per-trust-domain``.
    """
    ns = config.deployment.namespace
    return ns.name if ns.strategy == "single" else f"{ns.name}-{trust_domain}"


def coordinator_service(config: LensembleConfig) -> str:
    """In-cluster DNS name of the coordinator's Service: ``<run.name>-coordinator.<ns>.svc``."""
    return f"{coordinator_name(config)}.{coordinator_namespace(config)}.svc"


def tls_secret_name(config: LensembleConfig, identity: str) -> str:
    """Default name of an identity's TLS Secret: ``<run.name>-<identity>-tls``.

    Args:
        config: The config (``run.name``).
        identity: ``coordinator`` or a participant id.
    """
    return f"{config.run.name}-{identity}-tls"
