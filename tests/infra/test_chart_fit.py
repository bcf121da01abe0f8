"""The release each stack would install, rendered by Helm: the stack's overrides are real chart
knobs, and the chart's pods use exactly the identities and nodes Pulumi made for them."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from tests.infra.conftest import PARTICIPANT_STACKS, STACKS, stack_lensemble_config
from tests.support.tools import require

# pulumi_aws warns about its own deprecated classes whenever the engine loads them.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pulumi_aws")


def helm_merge(base: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    """Values files merged as ``helm -f base -f layer`` does: maps deeply, the rest replaced."""
    out = copy.deepcopy(base)
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = helm_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


_RENDERED: dict[int, list[dict[str, Any]]] = {}


def rendered(capture) -> list[dict[str, Any]]:
    """The manifests of a stack's Helm release, rendered with its two values files (once)."""
    require("helm")
    if id(capture) in _RENDERED:
        return _RENDERED[id(capture)]
    from lensemble.render.k8s import render_chart

    [release] = capture.of_type("kubernetes:helm.sh/v3:Release")
    files = [yaml.safe_load(asset.text) for asset in release.inputs["valueYamlFiles"]]
    values = helm_merge(files[0], files[1])
    docs = render_chart(values, namespace=release.inputs["namespace"], source=capture.stack)
    _RENDERED[id(capture)] = docs
    return docs


def of_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


@pytest.mark.parametrize("stack", STACKS)
def test_chart_renders_without_namespaces_pulumi_owns(captured, stack):
    docs = rendered(captured(stack))
    assert docs
    assert of_kind(docs, "Namespace") == []


@pytest.mark.parametrize("stack", ["staging", *PARTICIPANT_STACKS])
def test_participant_pods_run_as_the_service_account_pod_identity_binds(captured, stack):
    capture = captured(stack)
    docs = rendered(capture)
    bound = {
        (a.inputs["namespace"], a.inputs["serviceAccount"])
        for a in capture.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
    }
    used = {
        (s["metadata"]["namespace"], s["spec"]["template"]["spec"]["serviceAccountName"])
        for s in of_kind(docs, "StatefulSet")
    }
    assert used == bound


@pytest.mark.parametrize("stack", PARTICIPANT_STACKS)
def test_participant_pods_pull_from_their_own_region(captured, stack):
    capture = captured(stack)
    url = capture.exports["imageRepositoryUrl"]
    images = {
        c["image"]
        for s in of_kind(rendered(capture), "StatefulSet")
        for c in s["spec"]["template"]["spec"]["containers"]
    }
    assert images and all(image.startswith(f"{url}:") for image in images)


def test_coordinator_lands_on_the_confidential_pool(captured):
    capture = captured("sovereign-prod")
    [deployment] = of_kind(rendered(capture), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    selector = pod["nodeSelector"]
    pools = [
        g
        for g in capture.of_type("aws:eks/nodeGroup:NodeGroup")
        if selector.items() <= g.inputs["labels"].items()
    ]
    assert [g.inputs["labels"]["lensemble.dev/pool"] for g in pools] == ["coordinator"]
    for taint in pools[0].inputs["taints"]:
        assert any(t["key"] == taint["key"] for t in pod["tolerations"])


def test_coordinator_service_faces_only_the_listed_participants(run_stack):
    config = stack_lensemble_config("sovereign-prod")
    capture = run_stack(
        "sovereign-prod", "aws", {"lensemble:coordinatorIngressCidrs": ["198.51.100.0/24"]}
    )
    docs = rendered(capture)
    [service] = [
        s for s in of_kind(docs, "Service") if s["metadata"]["name"].endswith("-coordinator")
    ]
    assert service["spec"]["type"] == "LoadBalancer"
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    # The load balancer listens on gRPC and on the model download, for the same addresses.
    assert config.network.download_port is not None
    assert ports["grpc"] == config.network.port
    assert ports["download"] == config.network.download_port
    annotations = service["metadata"]["annotations"]
    assert (
        annotations["service.beta.kubernetes.io/load-balancer-source-ranges"] == "198.51.100.0/24"
    )
    [policy] = [
        p for p in of_kind(docs, "NetworkPolicy") if p["metadata"]["name"].endswith("-participants")
    ]
    [rule] = policy["spec"]["ingress"]
    assert {"ipBlock": {"cidr": "198.51.100.0/24"}} in rule["from"]
    assert [p["port"] for p in rule["ports"]] == ["grpc", "download"]


@pytest.mark.parametrize("stack", PARTICIPANT_STACKS[:1])
def test_participants_dial_the_ports_the_coordinator_serves(run_stack, stack):
    """A participant stack's pods dial the coordinator's gRPC and model download ports (the
    ports of its load balancer), and may leave for the listed coordinator addresses on those
    two ports only."""
    config = stack_lensemble_config(stack)
    capture = run_stack(stack, "aws", {"lensemble:coordinatorCidrs": ["198.51.100.20/32"]})
    docs = rendered(capture)
    [configmap] = [c for c in of_kind(docs, "ConfigMap") if "config.yaml" in c.get("data", {})]
    dialed = yaml.safe_load(configmap["data"]["config.yaml"])["network"]
    assert config.network.download_port is not None
    assert dialed["download_port"] == config.network.download_port
    [policy] = [
        p for p in of_kind(docs, "NetworkPolicy") if p["metadata"]["name"].endswith("-coordinator")
    ]
    [rule] = policy["spec"]["egress"]
    assert {"ipBlock": {"cidr": "198.51.100.20/32"}} in rule["to"]
    assert [p["port"] for p in rule["ports"]] == [dialed["port"], dialed["download_port"]]


def test_long_names_are_shortened_like_the_chart_does(run_stack, tmp_path):
    from tests.infra.conftest import REPO

    data = yaml.safe_load((REPO / "config/staging.yaml").read_text())
    data["run"]["name"] = "a-rather-long-consortium-run-name-2026"
    data["federation"]["participants"] = [
        {"id": f"site-{i}", "trust_domain": f"organisation-with-long-name-{i}"} for i in range(3)
    ]
    data["federation"]["participant_count"] = 3
    config_file = tmp_path / "long.yaml"
    config_file.write_text(yaml.safe_dump(data))
    capture = run_stack("staging", "aws", {"lensemble:configFile": str(config_file)})
    bound = {
        a.inputs["serviceAccount"]
        for a in capture.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
    }
    assert all(len(name) <= 52 for name in bound)
    used = {
        s["spec"]["template"]["spec"]["serviceAccountName"]
        for s in of_kind(rendered(capture), "StatefulSet")
    }
    assert used == bound and len(bound) == 3
