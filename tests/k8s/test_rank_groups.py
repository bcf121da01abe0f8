"""Multi-rank participants on Kubernetes: pod groups, the rendezvous Service, gang admission and
the NetworkPolicy among one participant's ranks (docs/how-to/multi-rank-deployment.md)."""

from __future__ import annotations

from typing import Any

import pytest

from lensemble.config import load_config
from lensemble.config.schema import NODE_RANK_ENV, RENDEZVOUS_HOST_ENV
from lensemble.errors import ConfigError
from lensemble.render.helm_values import render_helm_values
from lensemble.render.k8s import render_chart
from lensemble.render.k8s_policy import workloads
from lensemble.render.ranks import PARTICIPANT_LABEL, SHM_PER_RANK_MIB, rank_pod
from tests.k8s.renders import CASES, REPO, config_of, render
from tests.support.tools import require

Docs = list[dict[str, Any]]
RANKED = sorted(n for n in CASES if "-ranks" in n)


def _of(docs: Docs, kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _owned(docs: Docs, kind: str, pid: str) -> dict[str, Any]:
    (doc,) = [d for d in _of(docs, kind) if d["metadata"]["labels"].get(PARTICIPANT_LABEL) == pid]
    return doc


def _env(doc: dict[str, Any]) -> dict[str, Any]:
    container = doc["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _selects_a_participant(policy: dict[str, Any]) -> bool:
    return PARTICIPANT_LABEL in (policy["spec"]["podSelector"].get("matchLabels") or {})


def _scheduling_keys(meta: dict[str, Any]) -> set[str]:
    keys = {**(meta.get("labels") or {}), **(meta.get("annotations") or {})}
    return {k for k in keys if k.startswith(("kueue.", "scheduling."))}


@pytest.mark.parametrize("case", ["helm-local-ranks-volcano", "helm-local-ranks-kueue"])
def test_a_multi_node_participant_is_a_pod_group_with_a_rendezvous_service(case: str) -> None:
    cfg = config_of(case)
    docs = render(case)
    sts = _owned(docs, "StatefulSet", "coastal")
    layout = cfg.rank_layout("coastal")
    assert sts["spec"]["replicas"] == layout.nodes == 2
    name = sts["metadata"]["name"]
    namespace = sts["metadata"]["namespace"]
    service = _owned(docs, "Service", "coastal")
    assert sts["spec"]["serviceName"] == service["metadata"]["name"] == name
    assert service["spec"]["clusterIP"] == "None"
    # The ranks rendezvous before node rank 0 is ready: its DNS name must exist before that.
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports["rendezvous"] == layout.rendezvous_port
    env = _env(sts)
    assert env[RENDEZVOUS_HOST_ENV] == f"{name}-0.{name}.{namespace}.svc"
    assert NODE_RANK_ENV in env
    spec = sts["spec"]["template"]["spec"]
    container = spec["containers"][0]
    pod = rank_pod(cfg, "coastal")
    assert container["resources"]["requests"] == {"cpu": pod.cpu, "memory": pod.memory}
    (shm,) = [v for v in spec["volumes"] if v["name"] == "shm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": f"{2 * SHM_PER_RANK_MIB}Mi"}
    assert {"name": "shm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    # alpine shares coastal's trust domain: one rank, but its own StatefulSet (one pod).
    alpine = _owned(docs, "StatefulSet", "alpine")
    assert alpine["spec"]["replicas"] == 1
    assert RENDEZVOUS_HOST_ENV not in _env(alpine)
    assert not [v for v in alpine["spec"]["template"]["spec"]["volumes"] if v["name"] == "shm"]
    # Trust domains without a multi-rank participant keep their shared StatefulSet.
    shared = [
        d for d in _of(docs, "StatefulSet") if PARTICIPANT_LABEL not in d["metadata"]["labels"]
    ]
    assert {d["metadata"]["labels"]["lensemble.dev/trust-domain"] for d in shared} == set(
        cfg.trust_domains
    ) - {"alpine-labs"}


def test_volcano_admits_each_participant_group_alone() -> None:
    case = "helm-local-ranks-volcano"
    docs = render(case)
    (group,) = _of(docs, "PodGroup")
    sts = _owned(docs, "StatefulSet", "coastal")
    assert group["metadata"]["name"] == sts["metadata"]["name"]
    assert group["metadata"]["namespace"] == sts["metadata"]["namespace"]
    assert group["spec"] == {"minMember": 2, "queue": "research"}
    meta = sts["spec"]["template"]["metadata"]
    assert meta["annotations"]["scheduling.k8s.io/group-name"] == group["metadata"]["name"]
    assert sts["spec"]["template"]["spec"]["schedulerName"] == "volcano"
    # Nobody else is in a gang: not the one-rank participants, not the StatefulSet itself.
    for other in _of(docs, "StatefulSet"):
        assert _scheduling_keys(other["metadata"]) == set()
        if other is not sts:
            assert _scheduling_keys(other["spec"]["template"]["metadata"]) == set()
            assert "schedulerName" not in other["spec"]["template"]["spec"]


def test_kueue_admits_each_participant_group_alone() -> None:
    docs = render("helm-local-ranks-kueue")
    assert _of(docs, "PodGroup") == []
    sts = _owned(docs, "StatefulSet", "coastal")
    meta = sts["spec"]["template"]["metadata"]
    assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "lensemble"
    assert meta["labels"]["kueue.x-k8s.io/pod-group-name"] == sts["metadata"]["name"]
    assert meta["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "2"
    # The StatefulSet is this participant's group alone (Kueue's statefulset integration).
    assert sts["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "lensemble"
    assert [
        d["metadata"]["name"] for d in _of(docs, "StatefulSet") if _scheduling_keys(d["metadata"])
    ] == [sts["metadata"]["name"]]
    groups = {
        d["spec"]["template"]["metadata"]["labels"].get("kueue.x-k8s.io/pod-group-name")
        for d in _of(docs, "StatefulSet")
    }
    assert groups == {None, sts["metadata"]["name"]}  # one group, one participant's pods


def test_gang_admission_is_off_by_default() -> None:
    cfg = load_config(
        REPO / "config/local.yaml",
        [
            "federation.participants[1].trust_domain=alpine-labs",
            "federation.participants[1].ranks.nodes=2",
        ],
    )
    assert cfg.deployment.gang_scheduling.scheduler == "none"
    require("helm")
    docs = render_chart(render_helm_values(cfg))
    assert _of(docs, "PodGroup") == []
    for _doc, meta, spec in workloads(docs):
        assert _scheduling_keys(meta) == set()
        assert "schedulerName" not in spec


@pytest.mark.parametrize("case", RANKED)
def test_ranks_of_one_participant_reach_each_other_and_no_one_else_does(case: str) -> None:
    cfg = config_of(case)
    docs = render(case)
    policies = _of(docs, "NetworkPolicy")
    multi_node = [pid for pid in cfg.participant_ids if cfg.rank_layout(pid).nodes > 1]
    ranked = [p for p in policies if _selects_a_participant(p)]
    assert sorted(p["metadata"]["labels"][PARTICIPANT_LABEL] for p in ranked) == multi_node
    for policy in ranked:
        pid = policy["metadata"]["labels"][PARTICIPANT_LABEL]
        sts = _owned(docs, "StatefulSet", pid)
        own = sts["spec"]["template"]["metadata"]["labels"]
        selector = policy["spec"]["podSelector"]["matchLabels"]
        assert policy["metadata"]["namespace"] == sts["metadata"]["namespace"]
        # Selects exactly this participant's pods, and no other workload's.
        assert selector == sts["spec"]["selector"]["matchLabels"]
        for other, meta, _ in workloads(docs):
            selected = labels_in(meta.get("labels") or {}, selector)
            assert selected is (other is sts), other["metadata"]["name"]
        assert labels_in(own, selector)
        for direction, peers in (("ingress", "from"), ("egress", "to")):
            (rule,) = policy["spec"][direction]
            # Every TCP port (rendezvous, then gloo or nccl), only among its own pods.
            assert rule["ports"] == [{"protocol": "TCP"}]
            assert rule[peers] == [{"podSelector": {"matchLabels": selector}}]


def labels_in(labels: dict[str, str], selector: dict[str, str]) -> bool:
    """Whether a selector selects pods carrying ``labels``."""
    return all(labels.get(k) == v for k, v in selector.items())


def test_single_node_ranks_are_one_pod_with_a_gpu_per_rank() -> None:
    case = "helm-sovereign-prod-ranks-gpu"
    cfg = config_of(case)
    docs = render(case)
    for pid in cfg.participant_ids:
        sts = _owned(docs, "StatefulSet", pid)
        assert sts["spec"]["replicas"] == 1
        container = sts["spec"]["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
        assert RENDEZVOUS_HOST_ENV not in _env(sts)  # one node: ranks meet on loopback
        assert "rendezvous" not in {p["name"] for p in container["ports"]}
    # Ranks on one pod talk over loopback: no rank-to-rank NetworkPolicy, no new Service port.
    assert not [p for p in _of(docs, "NetworkPolicy") if _selects_a_participant(p)]


def test_overlay_keeps_every_participant_group() -> None:
    case = "kustomize-staging-ranks"
    cfg = config_of(case)
    docs = render(case)
    for pid in cfg.participant_ids:
        sts = _owned(docs, "StatefulSet", pid)
        assert sts["spec"]["replicas"] == 2
        # The zone-spread component reaches these StatefulSets too.
        assert sts["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert _owned(docs, "NetworkPolicy", pid)["metadata"]["name"].endswith("-ranks")


def test_a_group_named_like_another_trust_domain_is_refused() -> None:
    cfg = load_config(
        REPO / "config/local.yaml",
        [
            # coastal's trust domain is alpine-labs; highland's is named 'coastal'.
            "federation.participants[1].trust_domain=alpine-labs",
            "federation.participants[1].ranks.processes_per_node=2",
            "federation.participants[2].trust_domain=coastal",
        ],
    )
    with pytest.raises(ConfigError) as raised:
        render_helm_values(cfg)
    (problem,) = raised.value.problems
    assert problem.path == "federation.participants[1].id"
    assert "trust domain 'coastal'" in problem.message
