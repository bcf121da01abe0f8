"""Every Kubernetes output the tests check, rendered once per session.

A case is one way of producing manifests: the chart through Helm (every environment, every install
mode, optional features switched on) or an environment's overlay through kubectl kustomize. The
renders are cached, so each costs Helm or kustomize time only once per test session.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lensemble.config import LensembleConfig, load_config
from lensemble.render.helm_values import render_helm_values
from tests.support.tools import require

REPO = Path(__file__).resolve().parents[2]
ENVS = ("local", "staging", "sovereign-prod")
PROD_DOMAINS = ("org-berlin", "org-dublin", "org-paris", "org-stockholm")
#: config/local.yaml with coastal in alpine's trust domain, on 2 nodes of 2 ranks each.
RANKED_LOCAL = (
    "federation.participants[1].trust_domain=alpine-labs",
    "federation.participants[1].ranks.nodes=2",
    "federation.participants[1].ranks.processes_per_node=2",
)
#: Secure aggregation: the masked upload is fixed point, so no int8 (and no int8 chunking).
MASKING = (
    "federation.aggregation=masking",
    "federation.quantization=none",
    "federation.int8_chunk=0",
)
#: Differential privacy: the first participant's own DP-SGD budget, and central DP-FedAvg on
#: the mean (a fixed clip: no bound scaled by the round's median norm).
PRIVACY = (
    "federation.participants[0].privacy="
    "{epsilon: 8, noise_multiplier: 1.1, sample_rate: 0.25, windows_per_record: 2}",
    "federation.central_privacy={clip_norm: 0.5, noise_multiplier: 0.8, epsilon: 20}",
    "federation.robustness.median_factor=null",
)
#: The issuer of the cert-manager masking and privacy cases: one CA signs every identity.
CLUSTER_ISSUER = "lensemble-ca"
#: cert-manager issues every identity's certificate from that one issuer.
CERT_MANAGER = (("tls", {"certManager": {"enabled": True, "issuerRef": {"name": CLUSTER_ISSUER}}}),)
#: The Secret holding the federation's CA bundle in the tls.caBundleSecret case.
FEDERATION_BUNDLE_SECRET = "lensemble-federation-ca"


@dataclass(frozen=True)
class Case:
    """One rendered output.

    Attributes:
        env: Environment (config/<env>.yaml).
        path: ``helm`` (the chart alone) or ``kustomize`` (the overlay over the chart).
        mode: Install mode (Helm only).
        trust_domain: Trust domain of a participant-mode release.
        overrides: ``--set`` overrides of the config.
        knobs: Extra chart values (merged over the rendered values).
    """

    env: str
    path: str = "helm"
    mode: str = "all"
    trust_domain: str | None = None
    overrides: tuple[str, ...] = ()
    knobs: tuple[tuple[str, Any], ...] = ()


CASES: dict[str, Case] = {
    **{f"helm-{env}": Case(env) for env in ENVS},
    **{f"kustomize-{env}": Case(env, path="kustomize") for env in ENVS},
    "helm-sovereign-prod-coordinator": Case(
        "sovereign-prod",
        mode="coordinator",
        knobs=(
            ("coordinator", {"service": {"type": "LoadBalancer", "annotations": {}}}),
            ("networkPolicy", {"participantPeers": [{"ipBlock": {"cidr": "198.51.100.0/24"}}]}),
        ),
    ),
    **{
        f"helm-sovereign-prod-participant-{td}": Case(
            "sovereign-prod",
            mode="participant",
            trust_domain=td,
            knobs=(
                ("networkPolicy", {"coordinatorPeers": [{"ipBlock": {"cidr": "203.0.113.10/32"}}]}),
            ),
        )
        for td in PROD_DOMAINS[:2]
    },
    # No model download port: the coordinator serves gRPC only (participants fetch over it).
    "helm-staging-no-download": Case("staging", overrides=("network.download_port=null",)),
    # Optional features on: cert-manager, ServiceMonitors, alert rules, the dashboard, a
    # confidential RuntimeClass.
    "helm-staging-features": Case(
        "staging",
        overrides=(
            "deployment.confidential_compute=true",
            "deployment.confidential_runtime_class=kata-cc-snp",
        ),
        knobs=(
            (
                "tls",
                {"certManager": {"enabled": True, "issuerRef": {"name": "lensemble-ca"}}},
            ),
            ("serviceMonitor", {"enabled": True, "labels": {"release": "prometheus"}}),
            ("prometheusRule", {"enabled": True, "labels": {"release": "prometheus"}}),
            ("grafanaDashboard", {"enabled": True}),
        ),
    ),
    # Several GPUs per participant with Kueue: one workload per participant pod.
    "helm-sovereign-prod-gpu-kueue": Case(
        "sovereign-prod",
        overrides=(
            "deployment.resources.participant.gpu=2",
            "deployment.image.tag=0.1.0-cu126",
        ),
        knobs=(("gangScheduling", {"scheduler": "kueue", "queue": "lensemble"}),),
    ),
    "helm-sovereign-prod-gpu-volcano": Case(
        "sovereign-prod",
        overrides=(
            "deployment.resources.participant.gpu=4",
            "deployment.image.tag=0.1.0-cu126",
        ),
        knobs=(("gangScheduling", {"scheduler": "volcano", "queue": "research"}),),
    ),
    # Multi-rank participants (docs/how-to/multi-rank-deployment.md). In local, coastal joins alpine's
    # trust domain and spans 2 nodes of 2 ranks: every participant of that trust domain becomes
    # its own StatefulSet, admitted by Volcano or Kueue as its own pod group.
    **{
        f"helm-local-ranks-{scheduler}": Case(
            "local",
            overrides=(
                *RANKED_LOCAL,
                f"deployment.gang_scheduling.scheduler={scheduler}",
                f"deployment.gang_scheduling.queue={queue}",
            ),
        )
        for scheduler, queue in (("volcano", "research"), ("kueue", "lensemble"))
    },
    # One node of 2 nccl ranks per participant: one pod with 2 GPUs.
    "helm-sovereign-prod-ranks-gpu": Case(
        "sovereign-prod",
        overrides=(
            "deployment.resources.participant.gpu=2",
            "deployment.image.tag=0.1.0-cu126",
            "federation.ranks.backend=nccl",
            "federation.ranks.processes_per_node=2",
        ),
    ),
    # Secure aggregation with cert-manager: one issuer signs every identity (issue 37).
    **{
        f"helm-{env}-masking": Case(
            env,
            overrides=MASKING,
            knobs=CERT_MANAGER,
        )
        for env in ENVS
    },
    # Differential privacy with cert-manager, under plain aggregation (the coordinator adds the
    # central noise) and under masking (the participants do), issue 38.
    **{
        f"helm-sovereign-prod-privacy{suffix}": Case(
            "sovereign-prod",
            overrides=(*PRIVACY, *extra),
            knobs=CERT_MANAGER,
        )
        for suffix, extra in (("", ()), ("-masking", MASKING))
    },
    # One organisation's release of a masked sovereign federation whose organisations' CAs
    # differ: the federation's CA bundle is every identity's ca.crt.
    "helm-sovereign-prod-masking-org-berlin": Case(
        "sovereign-prod",
        mode="participant",
        trust_domain="org-berlin",
        overrides=MASKING,
        knobs=(
            ("networkPolicy", {"coordinatorPeers": [{"ipBlock": {"cidr": "203.0.113.10/32"}}]}),
            ("tls", {"caBundleSecret": FEDERATION_BUNDLE_SECRET}),
        ),
    ),
    # The overlay over a chart render with every participant on 2 nodes of 2 ranks.
    "kustomize-staging-ranks": Case(
        "staging",
        path="kustomize",
        overrides=("federation.ranks.nodes=2", "federation.ranks.processes_per_node=2"),
    ),
}

HELM_CASES = [name for name, case in CASES.items() if case.path == "helm"]
KUSTOMIZE_CASES = [name for name, case in CASES.items() if case.path == "kustomize"]


@functools.cache
def config_of(name: str) -> LensembleConfig:
    """The source config of a case."""
    case = CASES[name]
    return load_config(REPO / "config" / f"{case.env}.yaml", list(case.overrides))


def values_of(name: str) -> dict[str, Any]:
    """The Helm values of a Helm case (rendered values plus the case's knobs)."""
    case = CASES[name]
    values = render_helm_values(config_of(name), mode=case.mode, trust_domain=case.trust_domain)
    for key, value in case.knobs:
        values[key] = copy.deepcopy(value)
    return values


@functools.cache
def _render(name: str) -> tuple[dict[str, Any], ...]:
    from lensemble.render.k8s import render_chart, render_k8s

    case = CASES[name]
    if case.path == "helm":
        return tuple(render_chart(values_of(name)))
    return tuple(render_k8s(config_of(name), case.env).manifests)


def render(name: str) -> list[dict[str, Any]]:
    """The documents of a case (a deep copy: tests may mutate it). Skips without the tools."""
    require("helm")
    if CASES[name].path == "kustomize":
        require("kubectl")
    return copy.deepcopy(list(_render(name)))
