"""The chart's ``networkPolicy`` values: peers outside the release and where DNS runs.

Default-deny NetworkPolicies with explicit allowances; the whole internet is never a peer
(the values schema refuses ``0.0.0.0/0`` and ``::/0``, the policy check of rendered manifests
anything that together covers every address).
"""

from __future__ import annotations

import ipaddress
from typing import Annotated

from pydantic import Field, StringConstraints, field_validator

from lensemble.config.schema import DNS1123_LABEL
from lensemble.render.knobs import Knobs as _Knobs

#: Address ranges that mean "anywhere": never a NetworkPolicy peer.
OPEN_CIDRS = ("0.0.0.0/0", "::/0")
#: An IPv4 or IPv6 CIDR with a prefix length of at least 1, syntactically (so Helm's schema
#: check refuses every ``/0``); the validators then parse it with ``ipaddress``.
CIDR_PATTERN = (
    r"^([0-9]{1,3}(\.[0-9]{1,3}){3}/([1-9]|[12][0-9]|3[0-2])"
    r"|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*/([1-9]|[1-9][0-9]|1[01][0-9]|12[0-8]))$"
)


def checked_cidr(cidr: str) -> str:
    """``cidr`` when it parses as a network narrower than every address.

    Raises:
        ValueError: It is not a CIDR, or its prefix length is 0 (every address).
    """
    try:
        network = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        raise ValueError(f"{cidr!r} is not a CIDR such as 203.0.113.10/32") from None
    if network.prefixlen == 0:
        raise ValueError(f"{cidr} is every address; name the peer's own range")
    return cidr


class IPBlock(_Knobs):
    """A NetworkPolicy ipBlock; the whole internet is never a valid peer.

    The values schema refuses the literal ``0.0.0.0/0`` and ``::/0``; blocks that only together
    cover every address (``0.0.0.0/1`` + ``128.0.0.0/1``) are refused by the policy check over
    the rendered manifests (``lensemble.render.k8s_policy``).
    """

    cidr: str = Field(
        ...,
        min_length=1,
        max_length=43,
        pattern=CIDR_PATTERN,
        description="CIDR of the peer, e.g. 203.0.113.10/32 (never 0.0.0.0/0 or ::/0).",
        json_schema_extra={"not": {"enum": list(OPEN_CIDRS)}},
    )
    except_: list[Annotated[str, StringConstraints(pattern=CIDR_PATTERN)]] = Field(
        default_factory=list, alias="except", description="CIDRs excluded from the block."
    )

    @field_validator("cidr")
    @classmethod
    def _a_network_not_everyone(cls, cidr: str) -> str:
        return checked_cidr(cidr)


class LabelSelector(_Knobs):
    """A Kubernetes label selector (matchLabels only)."""

    match_labels: dict[str, str] = Field(default_factory=dict, description="Labels to match.")


class NamespaceSelector(_Knobs):
    """A namespace selector that names at least one label (``{}`` would be every namespace)."""

    match_labels: dict[str, str] = Field(
        ...,
        min_length=1,
        description="Labels of the namespace, e.g. {kubernetes.io/metadata.name: monitoring}.",
    )


class Peer(_Knobs):
    """A NetworkPolicy peer outside this release (another cluster or namespace)."""

    ip_block: IPBlock | None = Field(None, description="Peer by address range.")
    namespace_selector: NamespaceSelector | None = Field(
        None, description="Peer by namespace (never empty: that is every namespace)."
    )
    pod_selector: LabelSelector | None = Field(None, description="Peer by pod labels.")


class DNSIPBlock(_Knobs):
    """An address DNS answers at outside any pod NetworkPolicy can select (one ipBlock)."""

    cidr: str = Field(
        ...,
        pattern=CIDR_PATTERN,
        max_length=43,
        description="CIDR of the DNS server, e.g. 169.254.20.10/32 (NodeLocal DNSCache).",
        json_schema_extra={"not": {"enum": list(OPEN_CIDRS)}},
    )

    @field_validator("cidr")
    @classmethod
    def _a_network_not_everyone(cls, cidr: str) -> str:
        return checked_cidr(cidr)


class DNSValues(_Knobs):
    """Where cluster DNS runs, so egress can allow exactly it (port 53, UDP and TCP).

    Pods are selected by ``namespace`` and ``podLabels``. DNS that answers from the node's own
    network (NodeLocal DNSCache at 169.254.20.10, any hostNetwork resolver) cannot be selected
    that way: list its address in ``ipBlocks``.
    """

    namespace: str = Field("kube-system", pattern=DNS1123_LABEL, description="DNS namespace.")
    pod_labels: dict[str, str] = Field(
        default_factory=lambda: {"k8s-app": "kube-dns"}, description="Labels of the DNS pods."
    )
    ip_blocks: list[DNSIPBlock] = Field(
        default_factory=list,
        description="DNS servers by address, allowed on port 53 beside the DNS pods: "
        "[{cidr: 169.254.20.10/32}] for NodeLocal DNSCache (docs/troubleshooting.md).",
    )


class NetworkPolicyValues(_Knobs):
    """Default-deny NetworkPolicies with explicit allowances."""

    enabled: bool = Field(True, description="Render the NetworkPolicies.")
    metrics_namespace: str = Field(
        "monitoring",
        pattern=DNS1123_LABEL,
        description="Namespace whose pods may scrape the metrics port.",
    )
    dns: DNSValues = Field(default_factory=DNSValues)
    coordinator_peers: list[Peer] = Field(
        default_factory=list,
        description="Extra egress peers for participants: the coordinator's address when it "
        "runs in another cluster (mode participant).",
    )
    participant_peers: list[Peer] = Field(
        default_factory=list,
        description="Extra ingress peers of the coordinator: participants in other clusters "
        "(mode coordinator).",
    )
