"""A config that breaks each cross-field rule of the registry (``lensemble.config.rules``).

Each example edits the config of Helm values that ``lensemble render helm-values`` wrote for a
case of ``tests/k8s/renders.py``: the same config feeds ``LensembleConfig`` and the chart, so
both must refuse it naming the same field. A rule without an example here fails
``tests/config/test_rules.py`` (and the chart test in ``tests/k8s``).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from tests.k8s.renders import values_of


@dataclass(frozen=True)
class Breaking:
    """Edits that break one rule.

    Attributes:
        case: The rendered values case the edits start from.
        edits: ``(path, value)`` edits of ``config``; ``"@0"`` copies participant 0's field.
        field: The field path the rule must name (its problem comes first).
        also: Field paths of other rules the edit cannot help breaking, in reporting order.
    """

    case: str
    edits: tuple[tuple[str, Any], ...]
    field: str
    also: tuple[str, ...] = field(default=())


STAGING = "helm-staging"
LOCAL = "helm-local"
MASKING = (("federation.aggregation", "masking"),)
#: The first two participants of config/local.yaml, as its rendered values list them.
TWO_LOCAL_PARTICIPANTS = [
    {
        "id": pid,
        "trust_domain": domain,
        "region": None,
        "env_params": params,
        "ranks": None,
        "privacy": None,
    }
    for pid, domain, params in (
        ("alpine", "alpine-labs", {"g": 6.5, "m": 0.8, "l": 0.9}),
        ("coastal", "coastal-robotics", {"g": 9.8, "m": 1.0, "l": 1.0}),
    )
]
PROD = "helm-sovereign-prod"
P1 = "federation.participants[1]"
#: A participant's differential privacy, every field given (as rendered values list them).
PRIVACY = {
    "epsilon": 8.0,
    "delta": 1e-5,
    "noise_multiplier": None,
    "max_grad_norm": 1.0,
    "sample_rate": 0.25,
    "windows_per_record": 8,
    "accountant": "rdp",
}
#: Central (user-level) differential privacy, every field given (as rendered values list them).
CENTRAL_PRIVACY = {
    "clip_norm": 1.0,
    "noise_multiplier": 1.0,
    "epsilon": None,
    "delta": 1e-5,
    "accountant": "rdp",
}
#: Central privacy and the fixed norm bound it needs.
CENTRAL = (
    ("federation.central_privacy", CENTRAL_PRIVACY),
    ("federation.robustness.median_factor", None),
)

#: Rule id -> the edits that break it (and, where unavoidable, a rule it implies).
BREAKING: dict[str, Breaking] = {
    "reserved-participant-id": Breaking(STAGING, ((f"{P1}.id", "coordinator"),), f"{P1}.id"),
    "unique-participant-id": Breaking(STAGING, ((f"{P1}.id", "@0"),), f"{P1}.id"),
    "known-physics-parameter": Breaking(
        STAGING,
        (("federation.participants[0].env_params.gravity", 9.0),),
        "federation.participants[0].env_params.gravity",
    ),
    "usable-physics-value": Breaking(
        STAGING,
        (("federation.participants[0].env_params.m", -1.0),),
        "federation.participants[0].env_params.m",
    ),
    "privacy-delta-below-records": Breaking(
        LOCAL,
        ((f"{P1}.privacy", {**PRIVACY, "delta": 0.1}),),
        f"{P1}.privacy.delta",
    ),
    "privacy-one-rank": Breaking(
        LOCAL,
        ((f"{P1}.privacy", PRIVACY), (f"{P1}.ranks", {"processes_per_node": 2})),
        f"{P1}.privacy",
    ),
    "privacy-needs-its-own-key": Breaking(
        LOCAL,
        ((f"{P1}.privacy", PRIVACY), ("network.auth", "insecure"), ("network.tls.enabled", False)),
        f"{P1}.privacy",
    ),
    "quorum-within-participants": Breaking(
        STAGING, (("federation.quorum", 9),), "federation.quorum"
    ),
    "supported-aggregation": Breaking(
        STAGING, (("federation.aggregation", "tee"),), "federation.aggregation"
    ),
    # The chart always runs the network transport, which masking refuses too (ordered last).
    "masking-threshold": Breaking(
        LOCAL,
        (*MASKING, ("federation.masking.threshold", 2)),
        "federation.masking.threshold",
    ),
    # 4 participants: 4 * 2**61 is 2**63, one more than an int64 holds; 60 bits fit.
    "masking-headroom": Breaking(
        LOCAL,
        (*MASKING, ("federation.masking.fractional_bits", 61)),
        "federation.masking.fractional_bits",
    ),
    "masking-survivors": Breaking(
        LOCAL,
        (
            *MASKING,
            ("federation.participants", TWO_LOCAL_PARTICIPANTS),
            ("federation.participant_count", 2),
            ("federation.quorum", 2),
        ),
        "federation.participants",
    ),
    "masking-sends-fixed-point": Breaking(STAGING, MASKING, "federation.quantization"),
    "overlap-needs-plain-aggregation": Breaking(
        LOCAL,
        (
            *MASKING,
            ("federation.overlap.mode", "one_round"),
            ("federation.outer_optimizer.momentum", 0.0),
        ),
        "federation.overlap.mode",
    ),
    "overlap-without-outer-momentum": Breaking(
        LOCAL, (("federation.overlap.mode", "one_round"),), "federation.outer_optimizer.momentum"
    ),
    "lr-hold-without-half-life": Breaking(
        LOCAL,
        (("federation.outer_optimizer.lr_hold_rounds", 20),),
        "federation.outer_optimizer.lr_hold_rounds",
    ),
    "masking-needs-client-certificates": Breaking(
        LOCAL,
        (*MASKING, ("network.auth", "token"), ("network.tls.client_auth", False)),
        "network.tls.client_auth",
    ),
    "central-privacy-noise-or-budget": Breaking(
        STAGING,
        (
            ("federation.central_privacy", {**CENTRAL_PRIVACY, "noise_multiplier": None}),
            ("federation.robustness.median_factor", None),
        ),
        "federation.central_privacy",
    ),
    "central-privacy-mean": Breaking(
        STAGING,
        (*CENTRAL, ("federation.robustness.aggregator", "median")),
        "federation.robustness.aggregator",
    ),
    "central-privacy-fixed-bound": Breaking(
        STAGING,
        (*CENTRAL, ("federation.robustness.median_factor", 1.0)),
        "federation.robustness.median_factor",
    ),
    "central-privacy-needs-its-own-key": Breaking(
        LOCAL,
        (*CENTRAL, ("network.auth", "insecure"), ("network.tls.enabled", False)),
        "federation.central_privacy",
    ),
    "central-privacy-aggregation": Breaking(
        STAGING,
        (*CENTRAL, ("federation.aggregation", "tee")),
        "federation.central_privacy",
        also=("federation.aggregation",),
    ),
    "reject-needs-headroom": Breaking(
        STAGING,
        (("federation.robustness.norm_bound_mode", "reject"),),
        "federation.robustness.norm_bound_mode",
    ),
    "int8-chunk-needs-int8": Breaking(
        STAGING,
        (("federation.quantization", "fp16"), ("federation.int8_chunk", 64)),
        "federation.int8_chunk",
    ),
    "residency-over-network": Breaking(
        STAGING, (("data.residency_enforced", False),), "data.residency_enforced"
    ),
    "rpc-within-round": Breaking(
        STAGING, (("network.rpc_timeout_s", 500),), "network.rpc_timeout_s"
    ),
    # 20 s: below the round timeout, still above the reconnect backoff's cap (10 s).
    "join-outlasts-round": Breaking(
        STAGING, (("federation.join_timeout_s", 20),), "federation.join_timeout_s"
    ),
    "backoff-within-join": Breaking(
        STAGING, (("network.connect_backoff_max_s", 10_000),), "network.connect_backoff_max_s"
    ),
    "liveness-above-keepalive": Breaking(
        STAGING, (("network.keepalive_s", 25),), "network.liveness_timeout_s"
    ),
    "liveness-within-round": Breaking(
        STAGING, (("network.liveness_timeout_s", 400),), "network.liveness_timeout_s"
    ),
    "holdout-leaves-both": Breaking(
        STAGING, (("data.holdout_fraction", 0.01),), "data.holdout_fraction"
    ),
    "window-within-episode": Breaking(STAGING, (("data.window", 200),), "data.window"),
    "k-steps-within-episode": Breaking(
        STAGING, (("evaluation.k_steps", 200),), "evaluation.k_steps"
    ),
    "distinct-ports": Breaking(STAGING, (("network.metrics_port", 50051),), "network.metrics_port"),
    "distinct-download-port": Breaking(
        STAGING, (("network.download_port", 50052),), "network.download_port"
    ),
    "tls-unless-insecure": Breaking(
        STAGING, (("network.tls.enabled", False),), "network.tls.enabled"
    ),
    "tls-ca-file": Breaking(STAGING, (("network.tls.ca_file", None),), "network.tls.ca_file"),
    "tls-cert-file": Breaking(STAGING, (("network.tls.cert_file", None),), "network.tls.cert_file"),
    "tls-key-file": Breaking(STAGING, (("network.tls.key_file", None),), "network.tls.key_file"),
    "mtls-client-auth": Breaking(
        STAGING, (("network.tls.client_auth", False),), "network.tls.client_auth"
    ),
    "kueue-queue": Breaking(
        STAGING,
        (("deployment.gang_scheduling.scheduler", "kueue"),),
        "deployment.gang_scheduling.queue",
    ),
    "gpus-need-cuda": Breaking(
        STAGING, (("deployment.resources.participant.gpu", 1),), "deployment.image.tag"
    ),
    "pinned-tag": Breaking(STAGING, (("deployment.image.tag", "latest"),), "deployment.image.tag"),
    "placement-of-a-trust-domain": Breaking(
        STAGING, (("deployment.trust_domains.x", {}),), "deployment.trust_domains.x"
    ),
    "sovereign-network": Breaking(
        PROD, (("federation.transport", "in_process"),), "federation.transport"
    ),
    "sovereign-mtls": Breaking(PROD, (("network.auth", "insecure"),), "network.auth"),
    "sovereign-confidential-compute": Breaking(
        PROD, (("deployment.confidential_compute", False),), "deployment.confidential_compute"
    ),
    "sovereign-namespaces": Breaking(
        PROD, (("deployment.namespace.strategy", "single"),), "deployment.namespace.strategy"
    ),
    # Participant 1's old trust domain keeps its placement, which now places nobody.
    "sovereign-own-trust-domain": Breaking(
        PROD,
        ((f"{P1}.trust_domain", "@0"),),
        f"{P1}.trust_domain",
        also=("deployment.trust_domains.org-dublin",),
    ),
    "sovereign-region": Breaking(
        PROD,
        (("federation.participants[0].region", None),),
        "federation.participants[0].region",
    ),
    # 64 ranks divide the batch of 128 but outnumber the 36 training episodes.
    "ranks-within-episodes": Breaking(
        STAGING,
        (("federation.ranks.processes_per_node", 64),),
        "federation.ranks.processes_per_node",
    ),
    # nccl without a CUDA image also lacks GPUs: a CUDA-less image with GPUs breaks another rule.
    "nccl-needs-cuda": Breaking(
        STAGING,
        (("federation.ranks.backend", "nccl"),),
        "federation.ranks.backend",
        also=("federation.ranks.processes_per_node",),
    ),
    "nccl-ranks-need-gpus": Breaking(
        "helm-sovereign-prod-ranks-gpu",
        (("deployment.resources.participant.gpu", 1),),
        "federation.ranks.processes_per_node",
    ),
    "rendezvous-port-free": Breaking(
        "helm-local-ranks-volcano",
        ((f"{P1}.ranks.rendezvous_port", 50052),),
        f"{P1}.ranks.rendezvous_port",
    ),
    "ranks-divide-batch": Breaking(
        STAGING,
        (("federation.ranks.processes_per_node", 3),),
        "federation.ranks.processes_per_node",
    ),
    "ranks-without-ema": Breaking(
        STAGING,
        (("federation.ranks.processes_per_node", 2), ("model.target", "ema")),
        "federation.ranks.processes_per_node",
    ),
    "bf16-needs-nccl": Breaking(
        STAGING,
        (("federation.ranks.mixed_precision", "bf16"),),
        "federation.ranks.mixed_precision",
    ),
}


def set_path(config: dict[str, Any], path: str, value: Any) -> None:
    """Set dotted ``path`` (``name[i]`` indexes a list); ``"@0"`` copies entry 0's field."""
    keys = [int(k) if k.isdigit() else k for k in re.split(r"\.|\[|\]\.?", path) if k != ""]
    node: Any = config
    for key in keys[:-1]:
        node = node[key]
    if value == "@0":
        value = config["federation"]["participants"][0][keys[-1]]
    node[keys[-1]] = value


def edited_values(case: str, edits: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """The rendered values of ``case`` with ``edits`` applied to their ``config``."""
    values = copy.deepcopy(values_of(case))
    for path, value in edits:
        set_path(values["config"], path, value)
    return values


def field_pattern(template: str) -> re.Pattern[str]:
    """A rule's field template as a regular expression (placeholders match any text)."""
    parts = re.split(r"\{[^{}]+\}", template)
    return re.compile(".+".join(re.escape(part) for part in parts))
