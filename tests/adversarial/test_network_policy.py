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
from lensemble.render.k8s_policy import violations
from lensemble.render.policy_reach import covers_every_address
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


# ------------------------------------------------------------------ the union of all policies
def _pod(name: str, labels: dict[str, str], namespace: str = "ns") -> dict[str, Any]:
    return {
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"template": {"metadata": {"labels": labels}, "spec": {"containers": []}}},
    }


def _selecting(
    name: str, selector: dict[str, Any], *peers: dict[str, Any], direction: str = "egress"
) -> dict[str, Any]:
    doc = _policy(*peers, direction=direction)
    doc["metadata"]["name"] = name
    doc["spec"]["podSelector"] = selector
    return doc


@pytest.mark.parametrize(
    ("halves", "direction"),
    [
        (("0.0.0.0/1", "128.0.0.0/1"), "egress"),
        (("0.0.0.0/1", "128.0.0.0/1"), "ingress"),
        (("::/1", "8000::/1"), "egress"),
    ],
)
def test_ranges_split_over_two_policies_that_select_one_pod_are_open(
    halves: tuple[str, str], direction: str
) -> None:
    pod = _pod("coordinator", {"app": "lensemble", "role": "coordinator"})
    first = _selecting(
        "a",
        {"matchLabels": {"role": "coordinator"}},
        {"ipBlock": {"cidr": halves[0]}},
        direction=direction,
    )
    second = _selecting("b", {}, {"ipBlock": {"cidr": halves[1]}}, direction=direction)
    assert _open_rules(first) == [] and _open_rules(second) == []  # each alone is narrow
    found = [
        v
        for v in violations([pod, first, second], CONFIG)
        if v.startswith("no-open-networkpolicy-rule")
    ]
    assert len(found) == 1, found
    assert "Deployment/coordinator in ns" in found[0] and direction in found[0]
    assert "NetworkPolicy/a in ns" in found[0] and "NetworkPolicy/b in ns" in found[0]


def test_ranges_split_over_policies_that_select_different_pods_are_not_open() -> None:
    docs = [
        _pod("coordinator", {"role": "coordinator"}),
        _pod("participant", {"role": "participant"}),
        _selecting(
            "a", {"matchLabels": {"role": "coordinator"}}, {"ipBlock": {"cidr": "0.0.0.0/1"}}
        ),
        _selecting(
            "b", {"matchLabels": {"role": "participant"}}, {"ipBlock": {"cidr": "128.0.0.0/1"}}
        ),
        # Another namespace's policy never selects these pods.
        _selecting("c", {}, {"ipBlock": {"cidr": "128.0.0.0/1"}})
        | {"metadata": {"name": "c", "namespace": "other"}},
    ]
    assert [v for v in violations(docs, CONFIG) if v.startswith("no-open-networkpolicy-rule")] == []


def test_a_pod_selector_with_expressions_is_matched_as_kubernetes_does() -> None:
    pod = _pod("coordinator", {"role": "coordinator", "tier": "core"})
    exists = {"matchExpressions": [{"key": "tier", "operator": "Exists"}]}
    not_in = {"matchExpressions": [{"key": "role", "operator": "NotIn", "values": ["participant"]}]}
    elsewhere = {"matchExpressions": [{"key": "role", "operator": "In", "values": ["participant"]}]}
    first = _selecting("a", exists, {"ipBlock": {"cidr": "0.0.0.0/1"}})
    second = _selecting("b", not_in, {"ipBlock": {"cidr": "128.0.0.0/1"}})
    assert _union_problems([pod, first, second])
    second["spec"]["podSelector"] = elsewhere
    assert _union_problems([pod, first, second]) == []


def _union_problems(docs: list[dict[str, Any]]) -> list[str]:
    return [v for v in violations(docs, CONFIG) if v.startswith("no-open-networkpolicy-rule")]


@pytest.mark.parametrize(
    "selector",
    [
        {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "Exists"}]},
        {"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]},
        {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": ["kube-system"],
                }
            ]
        },
        {
            "matchExpressions": [{"key": "team", "operator": "In", "values": []}]
        },  # invalid: no value
        {"matchLabels": {}, "matchExpressions": []},
    ],
)
def test_a_namespace_selector_that_names_no_namespace_is_every_namespace(
    selector: dict[str, Any],
) -> None:
    for peer in (
        {"namespaceSelector": selector},
        {"namespaceSelector": selector, "podSelector": {}},
        {"namespaceSelector": selector, "podSelector": {"matchLabels": {"app": "x"}}},
    ):
        (line,) = _open_rules(_policy(peer))
        assert "every namespace" in line


@pytest.mark.parametrize(
    "selector",
    [
        {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["monitoring"]}
            ]
        },
        {
            "matchLabels": {"kubernetes.io/metadata.name": "monitoring"},
            "matchExpressions": [{"key": "team", "operator": "Exists"}],
        },
    ],
)
def test_a_namespace_selector_that_names_its_namespaces_is_narrow(selector: dict[str, Any]) -> None:
    assert _open_rules(_policy({"namespaceSelector": selector})) == []


def test_a_peer_that_names_nothing_is_open() -> None:
    (line,) = _open_rules(_policy({}))
    assert "every address" in line
