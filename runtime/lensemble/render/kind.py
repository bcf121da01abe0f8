"""The local kind cluster: its config and the overlay patch that pins trust domains to workers.

Both are generated from the local config, so the kind workers always match its trust domains:
one control plane, and one worker per trust domain labelled ``lensemble.dev/trust-domain=<td>``.
``overlays/local/kind-cluster.yaml`` and ``overlays/local/pin-trust-domains.yaml`` are the
committed copies for ``config/local.yaml``; a test fails when they drift.
"""

from __future__ import annotations

import hashlib
from typing import Any

import yaml

from lensemble.config.schema import LensembleConfig
from lensemble.render.helm_values import participant_namespace

TRUST_DOMAIN_LABEL = "lensemble.dev/trust-domain"
#: kind node image, the Kubernetes version the manifests are validated against.
KIND_NODE_IMAGE = "kindest/node:v1.33.1"
KIND_CLUSTER_FILE = "kind-cluster.yaml"
PIN_PATCH_FILE = "pin-trust-domains.yaml"


def cluster_name(config: LensembleConfig) -> str:
    """Kind cluster name: ``deployment.kube_context`` without its ``kind-`` prefix.

    Returns:
        E.g. ``lensemble`` for context ``kind-lensemble``; ``lensemble`` when no context is set.
    """
    context = config.deployment.kube_context or "kind-lensemble"
    return context.removeprefix("kind-")


def kind_cluster(config: LensembleConfig) -> dict[str, Any]:
    """The kind cluster config (``kind.x-k8s.io/v1alpha4``) for a local config.

    Returns:
        One control-plane node and one worker per trust domain, labelled with it.
    """
    nodes: list[dict[str, Any]] = [{"role": "control-plane", "image": KIND_NODE_IMAGE}]
    nodes += [
        {"role": "worker", "image": KIND_NODE_IMAGE, "labels": {TRUST_DOMAIN_LABEL: td}}
        for td in config.trust_domains
    ]
    return {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "name": cluster_name(config),
        "nodes": nodes,
    }


def _statefulset_name(config: LensembleConfig, trust_domain: str) -> str:
    # Mirrors lensemble.participantName in charts/lensemble/templates/_helpers.tpl.
    name = f"{config.run.name}-{trust_domain}"
    if len(name) > 52:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        name = f"{name[:43].rstrip('-')}-{digest}"
    return name


def pin_trust_domains(config: LensembleConfig) -> list[dict[str, Any]]:
    """Strategic-merge patches: each trust domain's StatefulSet on its labelled kind worker."""
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {
                "name": _statefulset_name(config, td),
                "namespace": participant_namespace(config, td),
            },
            "spec": {"template": {"spec": {"nodeSelector": {TRUST_DOMAIN_LABEL: td}}}},
        }
        for td in config.trust_domains
    ]


def _yaml_stream(header: str, docs: list[dict[str, Any]]) -> str:
    lines = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    return lines + "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs)


def local_overlay_files(config: LensembleConfig) -> dict[str, str]:
    """The generated files of ``overlays/local`` besides the base, by file name."""
    note = "Generated from config/local.yaml by scripts/regenerate-k8s.sh: do not edit."
    return {
        KIND_CLUSTER_FILE: _yaml_stream(
            "kind cluster for the local overlay: one control plane, one worker per trust domain.\n"
            + note,
            [kind_cluster(config)],
        ),
        PIN_PATCH_FILE: _yaml_stream(
            "Pins each trust domain's participants to its kind worker (see kind-cluster.yaml).\n"
            + note,
            pin_trust_domains(config),
        ),
    }
