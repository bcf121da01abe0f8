"""The chart refuses every config a pod would refuse or silently mis-serve.

A pod runs the mounted config through ``LensembleConfig`` (exit 2 at start: a crash loop) and
relies on the container contract (a loopback ``listen_host`` never passes a probe). Each case
edits the config of values ``lensemble render helm-values`` wrote; the edit must break a rule of
``LensembleConfig`` (or the pod contract), and Helm must refuse the values (``render`` and
``lint``) naming the field. Every field path a rule of ``config.schema._check_rules`` can name
must have a case, so a new rule cannot miss the chart.
"""

from __future__ import annotations

import ast
import copy
import inspect
import re
from typing import Any

import pytest

from lensemble.config import schema as config_schema
from lensemble.config.load import validate_mapping
from lensemble.errors import ConfigError, UsageError
from lensemble.render.container import pod_contract
from tests.k8s.renders import REPO, values_of
from tests.support.tools import require

CHART = REPO / "charts" / "lensemble"

#: (case id, rendered values, edits of ``config`` as (path, value), the field named).
CASES: list[tuple[str, str, list[tuple[str, Any]], str]] = [
    # Issue 15, item 5: rendered without error, then never Ready.
    (
        "loopback-listen-host",
        "helm-staging",
        [("network.listen_host", "127.0.0.1")],
        "network.listen_host",
    ),
    ("output-outside-the-volume", "helm-staging", [("run.output_dir", "runs/x")], "run.output_dir"),
    (
        "in-process-in-a-pod",
        "helm-staging",
        [("federation.transport", "in_process")],
        "federation.transport",
    ),
    (
        "tls-file-not-mounted",
        "helm-staging",
        [("network.tls.ca_file", "/ca.crt")],
        "network.tls.ca_file",
    ),
    ("quorum", "helm-staging", [("federation.quorum", 9)], "federation.quorum"),
    (
        "latest-outside-local",
        "helm-staging",
        [("deployment.image.tag", "latest")],
        "deployment.image.tag",
    ),
    (
        "rpc-outlives-round",
        "helm-staging",
        [("network.rpc_timeout_s", 500)],
        "network.rpc_timeout_s",
    ),
    (
        "join-before-round",
        "helm-staging",
        [("federation.join_timeout_s", 1)],
        "federation.join_timeout_s",
    ),
    (
        "no-held-out-episode",
        "helm-staging",
        [("data.holdout_fraction", 0.01)],
        "data.holdout_fraction",
    ),
    ("window", "helm-staging", [("data.window", 200)], "data.window"),
    ("k-steps", "helm-staging", [("evaluation.k_steps", 200)], "evaluation.k_steps"),
    ("ports-collide", "helm-staging", [("network.metrics_port", 50051)], "network.metrics_port"),
    (
        "download-port-collides",
        "helm-staging",
        [("network.download_port", 50052)],
        "network.download_port",
    ),
    (
        "duplicate-id",
        "helm-staging",
        [("federation.participants[1].id", "@0")],
        "federation.participants[1].id",
    ),
    (
        "placement-of-nobody",
        "helm-staging",
        [("deployment.trust_domains.x", {})],
        "deployment.trust_domains.x",
    ),
    (
        "reserved-aggregation",
        "helm-staging",
        [("federation.aggregation", "tee")],
        "federation.aggregation",
    ),
    (
        "int8-chunk-without-int8",
        "helm-staging",
        [("federation.quantization", "fp16"), ("federation.int8_chunk", 64)],
        "federation.int8_chunk",
    ),
    (
        "no-residency-guard",
        "helm-staging",
        [("data.residency_enforced", False)],
        "data.residency_enforced",
    ),
    ("mtls-without-tls", "helm-staging", [("network.tls.enabled", False)], "network.tls.enabled"),
    (
        "mtls-without-client-auth",
        "helm-staging",
        [("network.tls.client_auth", False)],
        "network.tls.client_auth",
    ),
    (
        "gpu-without-cuda",
        "helm-staging",
        [("deployment.resources.participant.gpu", 1)],
        "deployment.image.tag",
    ),
    (
        "unknown-physics",
        "helm-staging",
        [("federation.participants[0].env_params.gravity", 9.0)],
        "federation.participants[0].env_params.gravity",
    ),
    (
        "negative-physics",
        "helm-staging",
        [("federation.participants[0].env_params.m", -1.0)],
        "federation.participants[0].env_params.m",
    ),
    # The rank-layout rules (config.schema._rank_layout_problems), federation-wide and per
    # participant.
    (
        "more-ranks-than-episodes",
        "helm-staging",
        [("federation.ranks.nodes", 64), ("federation.ranks.processes_per_node", 64)],
        "federation.ranks.processes_per_node",
    ),
    (
        "nccl-without-cuda",
        "helm-staging",
        [("federation.ranks.backend", "nccl")],
        "federation.ranks.backend",
    ),
    (
        "nccl-ranks-without-gpus",
        "helm-sovereign-prod-ranks-gpu",
        [("deployment.resources.participant.gpu", 1)],
        "federation.ranks.processes_per_node",
    ),
    (
        "bf16-on-gloo",
        "helm-staging",
        [("federation.ranks.mixed_precision", "bf16")],
        "federation.ranks.mixed_precision",
    ),
    (
        "participant-rendezvous-on-health-port",
        "helm-local-ranks-volcano",
        [("federation.participants[1].ranks.rendezvous_port", 50052)],
        "federation.participants[1].ranks.rendezvous_port",
    ),
    (
        "participant-rendezvous-on-download-port",
        "helm-local-ranks-volcano",
        [("federation.participants[1].ranks.rendezvous_port", 50053)],
        "federation.participants[1].ranks.rendezvous_port",
    ),
    (
        "kueue-without-queue",
        "helm-staging",
        [("deployment.gang_scheduling.scheduler", "kueue")],
        "deployment.gang_scheduling.queue",
    ),
    ("prod-token-auth", "helm-sovereign-prod", [("network.auth", "insecure")], "network.auth"),
    (
        "prod-no-confidential-compute",
        "helm-sovereign-prod",
        [("deployment.confidential_compute", False)],
        "deployment.confidential_compute",
    ),
    (
        "prod-one-namespace",
        "helm-sovereign-prod",
        [("deployment.namespace.strategy", "single")],
        "deployment.namespace.strategy",
    ),
    (
        "prod-no-region",
        "helm-sovereign-prod",
        [("federation.participants[0].region", None)],
        "federation.participants[0].region",
    ),
    (
        "prod-shared-trust-domain",
        "helm-sovereign-prod",
        [("federation.participants[1].trust_domain", "@0")],
        "federation.participants[1].trust_domain",
    ),
]


def _set(config: dict[str, Any], path: str, value: Any) -> None:
    """Set dotted ``path`` (``name[i]`` indexes a list); ``"@0"`` copies entry 0's field."""
    keys = [int(k) if k.isdigit() else k for k in re.split(r"\.|\[|\]\.?", path) if k != ""]
    node: Any = config
    for key in keys[:-1]:
        node = node[key]
    if value == "@0":
        value = config["federation"]["participants"][0][keys[-1]]
    node[keys[-1]] = value


def _edited(case: str, edits: list[tuple[str, Any]]) -> dict[str, Any]:
    values = copy.deepcopy(values_of(case))
    for path, value in edits:
        _set(values["config"], path, value)
    return values


def _helm() -> Any:
    require("helm")
    import helm_python

    return helm_python


def _rule_paths() -> list[re.Pattern[str]]:
    """The field path of every ``bad(...)`` in ``_check_rules`` (f-string parts as wildcards)."""
    tree = ast.parse(inspect.getsource(config_schema._check_rules))
    patterns = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "bad":
            first = node.args[0]
            parts = first.values if isinstance(first, ast.JoinedStr) else [first]
            text = "".join(
                re.escape(p.value) if isinstance(p, ast.Constant) else ".+" for p in parts
            )
            patterns.append(re.compile(text))
    return patterns


def test_every_rule_of_the_config_has_a_chart_case() -> None:
    named = [field for *_, field in CASES]
    missing = [p.pattern for p in _rule_paths() if not any(p.fullmatch(n) for n in named)]
    assert len(_rule_paths()) > 15
    assert missing == [], f"add a chart case (and the rule to the chart) for {missing}"


@pytest.mark.parametrize(("case", "edits", "field"), [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_helm_refuses_what_a_pod_would_refuse(
    case: str, edits: list[tuple[str, Any]], field: str
) -> None:
    from lensemble.render.k8s import render_chart

    helm = _helm()
    values = _edited(case, edits)
    contract = [path for path, _ in edits if path in pod_contract() or ".tls." in path]
    if not contract:
        # The edit breaks a rule of LensembleConfig itself: the pod would exit 2.
        with pytest.raises(ConfigError):
            validate_mapping(values["config"])
    with pytest.raises((ConfigError, UsageError)) as raised:
        render_chart(values, source="values.yaml")
    message = str(raised.value)
    parent, _, key = field.rpartition(".")
    # An unknown key is named by its parent and the key: "env_params: ... 'gravity' not allowed".
    assert field in message or (f"{parent}:" in message and f"'{key}'" in message), message
    if isinstance(raised.value, ConfigError):  # the values schema: `helm lint` refuses it too
        assert helm.lint(CHART, values)["errors"]
    else:  # a template check: `helm lint` only logs a `fail`; install and template refuse
        assert str(raised.value).startswith("values.yaml: config.")


def test_the_rendered_values_pass_before_each_edit() -> None:
    from lensemble.render.k8s import render_chart

    _helm()
    for case in sorted({c[1] for c in CASES}):
        assert render_chart(values_of(case))
