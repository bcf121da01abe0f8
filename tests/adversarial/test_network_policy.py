"""The "open to everyone" NetworkPolicy check parses addresses instead of matching one string.

On main only the literal ``0.0.0.0/0`` was caught: ``0.0.0.0/1`` + ``128.0.0.0/1`` (or
``::/1`` + ``8000::/1``) opened a rule to every address, and ``namespaceSelector: {}`` (every
namespace) passed.
"""

from __future__ import annotations

from typing import Any

import pytest

from lensemble.config.load import validate_mapping
from lensemble.render.chart_values import NetworkPolicyValues
from lensemble.render.k8s_policy import covers_every_address, violations
from tests.k8s.renders import config_of, render

CONFIG = validate_mapping({})


def _policy(*peers: dict[str, Any], direction: str = "egress") -> dict[str, Any]:
    key = "to" if direction == "egress" else "from"
    return {
        "kind": "NetworkPolicy",
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {direction: [{key: list(peers), "ports": [{"port": 50051}]}]},
    }


def _open_rules(doc: dict[str, Any]) -> list[str]:
    return [v for v in violations([doc], CONFIG) if v.startswith("no-open-networkpolicy-rule")]


@pytest.mark.parametrize(
    "cidrs",
    [
        ["0.0.0.0/0"],
        ["::/0"],
        ["0.0.0.0/1", "128.0.0.0/1"],
        ["::/1", "8000::/1"],
        ["0.0.0.0/2", "64.0.0.0/2", "128.0.0.0/1"],
        ["128.0.0.1/1", "0.0.0.0/1"],  # host bits set: still the same halves
    ],
)
def test_blocks_that_together_cover_everything_are_open(cidrs: list[str]) -> None:
    assert covers_every_address(cidrs)
    for direction in ("egress", "ingress"):
        doc = _policy(*({"ipBlock": {"cidr": c}} for c in cidrs), direction=direction)
        (line,) = _open_rules(doc)
        assert "together cover every address" in line


def test_halves_split_over_two_rules_of_one_policy_are_open() -> None:
    doc = _policy({"ipBlock": {"cidr": "0.0.0.0/1"}})
    doc["spec"]["egress"].append({"to": [{"ipBlock": {"cidr": "128.0.0.0/1"}}]})
    assert _open_rules(doc)


@pytest.mark.parametrize(
    "cidrs",
    [["10.0.0.0/8"], ["0.0.0.0/1"], ["0.0.0.0/1", "::/1"], ["203.0.113.10/32", "8000::/1"]],
)
def test_partial_ranges_are_not_open(cidrs: list[str]) -> None:
    assert not covers_every_address(cidrs)
    assert _open_rules(_policy(*({"ipBlock": {"cidr": c}} for c in cidrs))) == []


def test_an_except_list_does_not_make_everyone_acceptable() -> None:
    doc = _policy({"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}})
    assert _open_rules(doc)


def test_a_cidr_that_does_not_parse_is_reported() -> None:
    (line,) = _open_rules(_policy({"ipBlock": {"cidr": "everyone"}}))
    assert "'everyone', which is not a CIDR" in line


def test_an_empty_namespace_selector_is_refused() -> None:
    for peer in (
        {"namespaceSelector": {}},
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"a": "b"}}},
    ):
        (line,) = _open_rules(_policy(peer))
        assert "empty namespaceSelector (every namespace)" in line
    named = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    assert _open_rules(_policy(named)) == []
    by_expression = {
        "namespaceSelector": {
            "matchExpressions": [{"key": "team", "operator": "In", "values": ["ml"]}]
        }
    }
    assert _open_rules(_policy(by_expression)) == []


def test_chart_values_refuse_empty_namespace_selectors_and_open_blocks() -> None:
    with pytest.raises(ValueError, match="namespace_selector|namespaceSelector"):
        NetworkPolicyValues.model_validate({"coordinatorPeers": [{"namespaceSelector": {}}]})
    with pytest.raises(ValueError, match="cidr"):
        NetworkPolicyValues.model_validate({"participantPeers": [{"ipBlock": {"cidr": "::0/0"}}]})
    NetworkPolicyValues.model_validate(
        {"participantPeers": [{"ipBlock": {"cidr": "198.51.100.0/24"}}]}
    )


@pytest.mark.parametrize(
    "case",
    [
        "helm-sovereign-prod",
        "helm-sovereign-prod-coordinator",
        "helm-sovereign-prod-participant-org-berlin",
        "helm-staging-no-download",
    ],
)
def test_the_download_port_is_admitted_only_where_grpc_is(case: str) -> None:
    """Every rule naming the coordinator's model download port names its gRPC port too (one rule,
    so the same peers, cross-cluster ones included): the second port opens no new path."""
    net = config_of(case).network
    grpc = {"grpc", net.port}
    download = {"download", net.download_port} - {None}
    rules = [
        rule
        for doc in render(case)
        if doc["kind"] == "NetworkPolicy"
        for direction in ("ingress", "egress")
        for rule in doc["spec"].get(direction) or []
        if rule.get("ports")  # rank-to-rank rules: every port, among one participant's pods only
    ]
    with_grpc = [r for r in rules if grpc & {p.get("port") for p in r["ports"]}]
    with_download = [r for r in rules if download & {p.get("port") for p in r["ports"]}]
    assert with_grpc, "no rule admits the coordinator's gRPC port"
    assert with_download == (with_grpc if net.download_port is not None else [])
    for rule in with_grpc:
        assert len(rule["ports"]) == (1 if net.download_port is None else 2)
