"""Who a NetworkPolicy lets through: label selectors, peers, and address coverage.

The "open to everyone" check of rendered manifests (:mod:`lensemble.render.k8s_policy`) judges
what Kubernetes would allow, not how a rule is spelled: NetworkPolicies are additive, so the
peers of every policy that selects a pod count together; address ranges are parsed and summed
(``0.0.0.0/1`` in one policy and ``128.0.0.0/1`` in another is every IPv4 address); and a
namespace selector that names no namespace (``{}``, or only ``Exists``, ``DoesNotExist`` and
``NotIn`` expressions: every namespace carries ``kubernetes.io/metadata.name``) is every
namespace, whatever pod selector goes with it. Sources: the Kubernetes NetworkPolicy API
(``networking.k8s.io/v1``) and label selector semantics (``meta/v1 LabelSelector``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

#: The label selector operators Kubernetes knows (anything else is refused by its API server).
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def network(cidr: object) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """``cidr`` parsed (host bits allowed, as Kubernetes does), or None when it is no CIDR."""
    try:
        return ipaddress.ip_network(str(cidr), strict=False)
    except ValueError:
        return None


def covers_every_address(cidrs: Iterable[str]) -> bool:
    """True when the CIDRs together cover all of IPv4 or all of IPv6.

    ``except`` lists are left out on purpose: everyone but a few ranges is still everyone.
    Unparsable entries are ignored here (:func:`peer_problems` reports them).
    """
    networks = [n for n in (network(c) for c in cidrs) if n is not None]
    v4 = [n for n in networks if isinstance(n, ipaddress.IPv4Network)]
    v6 = [n for n in networks if isinstance(n, ipaddress.IPv6Network)]
    return list(ipaddress.collapse_addresses(v4)) == [ipaddress.IPv4Network("0.0.0.0/0")] or list(
        ipaddress.collapse_addresses(v6)
    ) == [ipaddress.IPv6Network("::/0")]


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a label selector selects an object with ``labels`` (``{}`` selects everything).

    Every ``matchLabels`` pair and every ``matchExpressions`` entry must hold. An operator
    Kubernetes does not know counts as selecting: the check then judges more policies together,
    never fewer.
    """
    selector = selector or {}
    pairs = selector.get("matchLabels") or {}
    if any(labels.get(str(key)) != str(value) for key, value in pairs.items()):
        return False
    return all(_holds(expr, labels) for expr in selector.get("matchExpressions") or [])


def _holds(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator = str(expr.get("key", "")), expr.get("operator")
    values = [str(v) for v in expr.get("values") or []]
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    return True


def names_its_namespaces(selector: Mapping[str, Any]) -> bool:
    """Whether a namespace selector narrows to namespaces it names.

    It does when it requires a label value: a ``matchLabels`` pair, or an ``In`` expression with
    values (every other constraint it adds narrows further). ``Exists``, ``DoesNotExist`` and
    ``NotIn`` alone name no namespace: every namespace has ``kubernetes.io/metadata.name``, any
    namespace may lack a label, and ``NotIn`` admits everything it does not list.
    """
    if selector.get("matchLabels"):
        return True
    return any(
        expr.get("operator") == "In" and expr.get("values")
        for expr in selector.get("matchExpressions") or []
    )


def peer_problems(name: str, direction: str, peer: Mapping[str, Any]) -> Iterator[str]:
    """What opens one NetworkPolicy peer too wide, one sentence each.

    A peer that names nothing, a namespace selector that names no namespace
    (:func:`names_its_namespaces`), a CIDR that does not parse.
    """
    if not any(key in peer for key in ("ipBlock", "namespaceSelector", "podSelector")):
        yield f"{name} allows {direction} to a peer that names nothing (every address)."
        return
    selector = peer.get("namespaceSelector")
    if selector is not None and not names_its_namespaces(selector or {}):
        spelled = (
            "a namespaceSelector that names no namespace"
            if selector
            else "an empty namespaceSelector"
        )
        yield (
            f"{name} allows {direction} with {spelled} (every namespace); name the namespace "
            "in matchLabels."
        )
    block = peer.get("ipBlock")
    if block is not None:
        cidr = str((block or {}).get("cidr", ""))
        if network(cidr) is None:
            yield f"{name} allows {direction} with {cidr!r}, which is not a CIDR."


def rule_cidrs(rules: Iterable[Mapping[str, Any]], peers_key: str) -> list[str]:
    """Every ipBlock CIDR of ``rules`` (``except`` lists left out: see covers_every_address)."""
    return [
        str((peer.get("ipBlock") or {}).get("cidr", ""))
        for rule in rules
        for peer in rule.get(peers_key) or []
        if peer.get("ipBlock") is not None
    ]
