"""DNS egress for every common cluster layout, NodeLocal DNSCache included (issue 15.6).

NodeLocal DNSCache answers at a link-local address on each node (169.254.20.10:53) from the
host network, so no pod selector reaches it: on main the only way out was to disable every
NetworkPolicy. ``networkPolicy.dns.ipBlocks`` (chart) and the ``node-local-dns`` Kustomize
component add it as an ipBlock peer on port 53.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from lensemble.render.chart_values import NetworkPolicyValues
from lensemble.render.k8s_policy import violations
from tests.k8s.renders import REPO, config_of, values_of
from tests.support.tools import require

NODE_LOCAL = {"cidr": "169.254.20.10/32"}


def _dns_policies(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        d
        for d in docs
        if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-allow-dns")
    ]


def _peers_and_ports(policy: dict[str, Any]) -> tuple[list[dict[str, Any]], set[tuple[int, str]]]:
    (rule,) = policy["spec"]["egress"]
    return rule["to"], {(p["port"], p["protocol"]) for p in rule["ports"]}


def test_the_chart_renders_dns_ipblocks_beside_the_dns_pods() -> None:
    require("helm")
    from lensemble.render.k8s import render_chart

    values = values_of("helm-sovereign-prod")
    values["networkPolicy"] = {"dns": {"ipBlocks": [NODE_LOCAL, {"cidr": "10.96.0.10/32"}]}}
    docs = list(render_chart(values))
    policies = _dns_policies(docs)
    assert len(policies) >= 2  # one per namespace of the release
    for policy in policies:
        peers, ports = _peers_and_ports(policy)
        assert {"ipBlock": NODE_LOCAL} in peers
        assert {"ipBlock": {"cidr": "10.96.0.10/32"}} in peers
        assert any("podSelector" in p for p in peers), "the DNS pods are still allowed"
        assert ports == {(53, "UDP"), (53, "TCP")}
    assert violations(docs, config_of("helm-sovereign-prod")) == []


def test_without_ipblocks_dns_egress_is_the_dns_pods_only() -> None:
    require("helm")
    from lensemble.render.k8s import render_chart

    for policy in _dns_policies(list(render_chart(values_of("helm-staging")))):
        peers, _ = _peers_and_ports(policy)
        assert all("ipBlock" not in p for p in peers)


def test_the_values_schema_allows_dns_ipblocks_and_refuses_everyone() -> None:
    NetworkPolicyValues.model_validate({"dns": {"ipBlocks": [NODE_LOCAL]}})
    for bad in ("0.0.0.0/0", "::/0", "not-a-cidr", "300.1.1.1/32"):
        with pytest.raises(ValueError, match="cidr"):
            NetworkPolicyValues.model_validate({"dns": {"ipBlocks": [{"cidr": bad}]}})


def test_the_kustomize_component_adds_node_local_dns(tmp_path: Path) -> None:
    require("kubectl")
    tree = tmp_path / "overlays"
    shutil.copytree(REPO / "overlays", tree)
    overlay = tree / "node-local"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["../staging/base"],
                "components": ["../components/node-local-dns"],
            }
        ),
        encoding="utf-8",
    )
    proc = subprocess.run(
        ["kubectl", "kustomize", str(overlay)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    policies = _dns_policies(docs)
    assert policies
    for policy in policies:
        peers, ports = _peers_and_ports(policy)
        assert peers[-1] == {"ipBlock": NODE_LOCAL}
        assert ports == {(53, "UDP"), (53, "TCP")}
    assert violations(docs, config_of("kustomize-staging")) == []
