"""The rendered topology follows the config: participants, identities, the mounted config, ports,
probes, resources, namespaces, TLS mounts and network reachability.

Checked on the Helm output and on every overlay's output (the overlay must not break it).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from lensemble.config import LensembleConfig, config_hash
from lensemble.config.load import validate_mapping
from lensemble.render.container import CONFIG_PATH, STATE_DIR, TLS_DIR
from lensemble.render.helm_values import participants_by_trust_domain, pod_config
from lensemble.render.k8s_policy import workloads
from lensemble.render.names import participant_namespace
from lensemble.render.prometheus import alert_rules_text
from lensemble.render.ranks import PARTICIPANT_LABEL, POD_INDEX_LABEL, rank_pod
from tests.k8s.renders import CASES, ENVS, REPO, config_of, render, values_of
from tests.support.tools import require

Docs = list[dict[str, Any]]
ALL_MODE = sorted(n for n, c in CASES.items() if c.mode == "all")


def _of(docs: Docs, kind: str, component: str | None = None) -> list[dict[str, Any]]:
    return [
        d
        for d in docs
        if d["kind"] == kind
        and component
        in (None, (d["metadata"].get("labels") or {}).get("app.kubernetes.io/component"))
    ]


def _pod(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    return next((m, s) for _, m, s in workloads([doc]))


def _container(doc: dict[str, Any]) -> dict[str, Any]:
    containers = _pod(doc)[1]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _participant_of(doc: dict[str, Any]) -> str | None:
    """The participant a StatefulSet of its own runs (rankGroups), else None."""
    return (doc["metadata"].get("labels") or {}).get(PARTICIPANT_LABEL)


def _reached_by_participants(cfg: LensembleConfig) -> dict[str, int]:
    """The coordinator's ports participants dial, by port name: gRPC and the model download."""
    ports = {"grpc": cfg.network.port}
    if cfg.network.download_port is not None:
        ports["download"] = cfg.network.download_port
    return ports


def _admits(rule: dict[str, Any], name: str, number: int) -> bool:
    """Whether a NetworkPolicy rule admits a port given by name or number (no ports: all)."""
    ports = rule.get("ports")
    return not ports or any(p.get("port") in (None, name, number) for p in ports)


@pytest.mark.parametrize("case", ALL_MODE)
def test_one_statefulset_per_trust_domain_with_its_participants(case: str) -> None:
    """One StatefulSet per trust domain, or one per participant where a participant has ranks."""
    cfg = config_of(case)
    expected = participants_by_trust_domain(cfg)
    grouped = {
        p.trust_domain for p in cfg.federation.participants if rank_pod(cfg, p.id).multi_rank
    }
    statefulsets = _of(render(case), "StatefulSet")
    found: dict[str, list[str]] = {}
    for sts in statefulsets:
        td = sts["metadata"]["labels"]["lensemble.dev/trust-domain"]
        meta, _ = _pod(sts)
        env = _env(_container(sts))
        assert env["LENSEMBLE_TRUST_DOMAIN"] == td
        assert env["LENSEMBLE_ROLE"] == "participant"
        assert sts["spec"]["podManagementPolicy"] == "Parallel"
        assert sts["metadata"]["namespace"] == participant_namespace(cfg, td)
        pid = _participant_of(sts)
        if pid is None:
            assert td not in grouped
            assert env["LENSEMBLE_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
            # Pod <name>-<i> is the trust domain's i-th participant in config order.
            assert meta["annotations"]["lensemble.dev/participants"] == ",".join(expected[td])
            assert sts["spec"]["replicas"] == len(expected[td])
            found[td] = list(expected[td])
        else:
            # Its own StatefulSet: the id in the environment, the pod ordinal is the node rank.
            assert td in grouped
            assert "LENSEMBLE_POD_NAME" not in env
            assert env["LENSEMBLE_PARTICIPANT_ID"] == pid
            assert env["LENSEMBLE_NODE_RANK"] == {
                "fieldRef": {"fieldPath": f"metadata.labels['{POD_INDEX_LABEL}']"}
            }
            assert sts["spec"]["replicas"] == cfg.rank_layout(pid).nodes
            assert meta["labels"][PARTICIPANT_LABEL] == pid
            found.setdefault(td, []).append(pid)
    assert {td: sorted(ids) for td, ids in found.items()} == {
        td: sorted(ids) for td, ids in expected.items()
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_mounted_config_is_the_source_config(case: str) -> None:
    cfg = config_of(case)
    docs = render(case)
    maps = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in _of(docs, "ConfigMap")}
    pods = list(workloads(d for d in docs if d["kind"] != "Pod"))
    assert pods
    for doc, _, spec in pods:
        volume = next(v for v in spec["volumes"] if v["name"] == "config")
        configmap = maps[(doc["metadata"]["namespace"], volume["configMap"]["name"])]
        mounted = validate_mapping(yaml.safe_load(configmap["data"]["config.yaml"]))
        assert config_hash(mounted) == config_hash(cfg)
        assert mounted == pod_config(cfg)
        container = spec["containers"][0]
        mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
        assert mount == {
            "name": "config",
            # The chart's literal path is the contract's (lensemble.render.container).
            "mountPath": CONFIG_PATH,
            "subPath": "config.yaml",
            "readOnly": True,
        }
        assert _env(container)["LENSEMBLE_CONFIG"] == CONFIG_PATH


@pytest.mark.parametrize("case", ALL_MODE)
def test_ports_probes_and_resources_match_the_config(case: str) -> None:
    cfg = config_of(case)
    net = cfg.network
    docs = render(case)
    (deployment,) = _of(docs, "Deployment")
    for doc in [deployment, *_of(docs, "StatefulSet")]:
        container = _container(doc)
        role = doc["metadata"]["labels"]["app.kubernetes.io/component"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        expected = {"health": net.health_port, "metrics": net.metrics_port}
        pid = _participant_of(doc)
        if pid is not None and cfg.rank_layout(pid).nodes > 1:
            expected["rendezvous"] = cfg.rank_layout(pid).rendezvous_port
        reached = _reached_by_participants(cfg)
        assert ports == ({**reached, **expected} if role == "coordinator" else expected)
        assert container["livenessProbe"]["grpc"] == {"port": net.health_port}
        assert container["startupProbe"]["grpc"] == {"port": net.health_port}
        assert container["readinessProbe"]["grpc"] == {
            "port": net.health_port,
            "service": "lensemble.Readiness",
        }
        want: Any = getattr(cfg.deployment.resources, role)
        if pid is not None:  # a pod of several ranks: the per-rank resources times its ranks
            want = rank_pod(cfg, pid)
        resources = container["resources"]
        if CASES[case].env != "local" or CASES[case].path == "helm":
            assert resources["requests"]["cpu"] == want.cpu
        assert resources["requests"]["memory"] == want.memory
        assert resources["limits"]["memory"] == want.memory
        assert container["image"] == f"{cfg.deployment.image.repository}:{cfg.deployment.image.tag}"
        assert container["args"] == ["serve"]
    (service,) = _of(docs, "Service", "coordinator")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        **_reached_by_participants(cfg),
        "health": net.health_port,
        "metrics": net.metrics_port,
    }
    # Each Service port reaches the container port of its name.
    assert all(p["targetPort"] == p["name"] for p in service["spec"]["ports"])


@pytest.mark.parametrize("case", ALL_MODE)
def test_coordinator_is_one_writer_with_persistent_state(case: str) -> None:
    docs = render(case)
    (deployment,) = _of(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    _, spec = _pod(deployment)
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in spec["volumes"]
        if "persistentVolumeClaim" in v
    ]
    (pvc,) = _of(docs, "PersistentVolumeClaim")
    assert claims == [pvc["metadata"]["name"]]
    state = next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "state")
    assert state["mountPath"] == STATE_DIR
    (pdb,) = _of(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["maxUnavailable"] == 0


@pytest.mark.parametrize("case", ALL_MODE)
def test_each_pod_mounts_only_its_own_identities_tls(case: str) -> None:
    cfg = config_of(case)
    expected = participants_by_trust_domain(cfg)
    for _doc, meta, spec in workloads(render(case)):
        role = meta["labels"]["app.kubernetes.io/component"]
        tls = [v for v in spec["volumes"] if v["name"] == "tls"]
        if role == "test":
            assert tls == []
            continue
        (volume,) = tls
        sources = volume["projected"]["sources"]
        assert all(set(s) == {"secret"} for s in sources), "TLS comes from Secrets only"
        identities = sorted(
            {i["path"].split("/")[0] for s in sources for i in s["secret"]["items"]}
        )
        if role == "coordinator":
            assert identities == ["coordinator"]
        elif PARTICIPANT_LABEL in meta["labels"]:
            assert identities == [meta["labels"][PARTICIPANT_LABEL]]
        else:
            td = meta["labels"]["lensemble.dev/trust-domain"]
            assert identities == sorted(expected[td])
        names = {s["secret"]["name"] for s in sources}
        assert names == {f"{cfg.run.name}-{i}-tls" for i in identities}
        # Mounted where the pod's config (pod_config) looks for each identity's files.
        (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "tls"]
        assert mount["mountPath"] == TLS_DIR
        assert pod_config(cfg).network.tls.ca_file == f"{TLS_DIR}/{{identity}}/ca.crt"


@pytest.mark.parametrize("case", ALL_MODE)
def test_participants_may_reach_the_coordinator_ports_and_nothing_else(case: str) -> None:
    """Participants reach gRPC and (unless null) the model download, and nothing else does."""
    cfg = config_of(case)
    docs = render(case)
    policies = _of(docs, "NetworkPolicy")
    reached = _reached_by_participants(cfg)
    (deployment,) = _of(docs, "Deployment")
    coordinator_labels = _pod(deployment)[0]["labels"]
    container_ports = {p["name"]: p["containerPort"] for p in _container(deployment)["ports"]}
    for td in cfg.trust_domains:
        ns = participant_namespace(cfg, td)
        # Rank-to-rank policies (one participant's own pods) are test_rank_groups.py's.
        egress = [
            rule
            for p in policies
            if p["metadata"]["namespace"] == ns
            and (p["spec"]["podSelector"].get("matchLabels") or {}).get(
                "lensemble.dev/trust-domain"
            )
            == td
            and PARTICIPANT_LABEL not in p["spec"]["podSelector"].get("matchLabels", {})
            for rule in p["spec"].get("egress", [])
        ]
        (rule,) = egress
        assert rule["ports"] == [{"port": port, "protocol": "TCP"} for port in reached.values()]
        (peer,) = rule["to"]
        assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "coordinator"
        assert peer["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": cfg.deployment.namespace.name
        }
    (ingress,) = [p for p in policies if p["metadata"]["name"].endswith("-allow-participants")]
    sources = {
        peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
        + "/"
        + peer["podSelector"]["matchLabels"]["lensemble.dev/trust-domain"]
        for peer in ingress["spec"]["ingress"][0]["from"]
    }
    assert sources == {f"{participant_namespace(cfg, td)}/{td}" for td in cfg.trust_domains}
    # Named ports: each names a port the coordinator's container serves, at the config's number.
    admitted = [p["port"] for p in ingress["spec"]["ingress"][0]["ports"]]
    assert admitted == list(reached)
    assert {name: container_ports[name] for name in admitted} == reached
    # No other policy admits anyone to those ports of the coordinator.
    for name, number in reached.items():
        admitting = [
            p["metadata"]["name"]
            for p in policies
            if p["metadata"]["namespace"] == cfg.deployment.namespace.name
            and (p["spec"]["podSelector"].get("matchLabels") or {}).items()
            <= coordinator_labels.items()
            and any(_admits(rule, name, number) for rule in p["spec"].get("ingress", []))
        ]
        assert admitting == [ingress["metadata"]["name"]], name


def test_a_null_download_port_renders_no_download_port() -> None:
    default = config_of("helm-staging").network.download_port
    assert default is not None
    assert config_of("helm-staging-no-download").network.download_port is None
    for case, rendered in (("helm-staging", True), ("helm-staging-no-download", False)):
        docs = render(case)
        (deployment,) = _of(docs, "Deployment")
        (service,) = _of(docs, "Service", "coordinator")
        named = [p["name"] for p in [*_container(deployment)["ports"], *service["spec"]["ports"]]]
        assert named.count("download") == (2 if rendered else 0), case
        rules = [
            rule
            for policy in _of(docs, "NetworkPolicy")
            for direction in ("ingress", "egress")
            for rule in policy["spec"].get(direction, [])
            if rule.get("ports")  # rank-to-rank rules admit every port of the rank's own pods
        ]
        admitting = [rule for rule in rules if _admits(rule, "download", default)]
        # Mode all: the coordinator's ingress and each trust domain's egress.
        expected = 1 + len(config_of(case).trust_domains) if rendered else 0
        assert len(admitting) == expected, case


@pytest.mark.parametrize("download_port", [50053, None])
def test_notes_name_the_download_port_only_when_served(download_port: int | None) -> None:
    require("helm")
    import helm_python

    values = values_of("helm-staging")
    values["config"]["network"]["download_port"] = download_port
    with helm_python.Chart.load(REPO / "charts" / "lensemble") as chart:
        rendered = chart.render(values, name="notes", namespace="default", is_install=True)
    (notes,) = [text for name, text in rendered.items() if name.endswith("NOTES.txt")]
    host = values["config"]["network"]["host"]
    assert f"gRPC {host}:{values['config']['network']['port']}," in notes
    if download_port is None:
        assert "download" not in notes
    else:
        assert f"model download {host}:{download_port}," in notes


@pytest.mark.parametrize("env", ENVS)
def test_namespaces_follow_the_namespace_strategy(env: str) -> None:
    cfg = config_of(f"helm-{env}")
    namespaces = {d["metadata"]["name"] for d in _of(render(f"helm-{env}"), "Namespace")}
    expected = {cfg.deployment.namespace.name} | {
        participant_namespace(cfg, td) for td in cfg.trust_domains
    }
    assert namespaces == expected
    if cfg.deployment.namespace.strategy == "per-trust-domain":
        assert len(namespaces) == len(cfg.trust_domains) + 1


def test_participant_mode_installs_one_trust_domain_only() -> None:
    case = "helm-sovereign-prod-participant-org-berlin"
    docs = render(case)
    assert not _of(docs, "Deployment")
    (sts,) = _of(docs, "StatefulSet")
    assert sts["metadata"]["labels"]["lensemble.dev/trust-domain"] == "org-berlin"
    assert {d["metadata"].get("namespace", d["metadata"]["name"]) for d in docs} == {
        "lensemble-org-berlin"
    }
    (egress,) = [
        p
        for p in _of(docs, "NetworkPolicy")
        if p["metadata"]["name"].endswith("-allow-coordinator")
    ]
    assert {"ipBlock": {"cidr": "203.0.113.10/32"}} in egress["spec"]["egress"][0]["to"]


def test_coordinator_mode_installs_no_participant() -> None:
    docs = render("helm-sovereign-prod-coordinator")
    assert not _of(docs, "StatefulSet")
    (service,) = _of(docs, "Service", "coordinator")
    assert service["spec"]["type"] == "LoadBalancer"
    (ingress,) = [
        p
        for p in _of(docs, "NetworkPolicy")
        if p["metadata"]["name"].endswith("-allow-participants")
    ]
    assert {"ipBlock": {"cidr": "198.51.100.0/24"}} in ingress["spec"]["ingress"][0]["from"]
    (test_pod,) = _of(docs, "Pod", "test")
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert test_pod["spec"]["containers"][0]["args"] == [
        "health",
        "--host",
        "lensemble-prod-coordinator.lensemble.svc",
        "--port",
        "50052",
        "--ready",
    ]


def test_optional_features_render_from_knobs() -> None:
    cfg = config_of("helm-staging-features")
    docs = render("helm-staging-features")
    certificates = _of(docs, "Certificate")
    assert len(certificates) == len(cfg.federation.participants) + 1
    for cert in certificates:
        assert cert["spec"]["issuerRef"]["name"] == "lensemble-ca"
        if cert["metadata"]["labels"]["app.kubernetes.io/component"] == "participant":
            (name,) = cert["spec"]["dnsNames"]
            assert cert["spec"]["commonName"] == name
            assert cert["spec"]["secretName"] == f"{cfg.run.name}-{name}-tls"
            assert cert["spec"]["usages"][0] == "client auth"
        else:
            assert cfg.network.host in cert["spec"]["dnsNames"]
            assert cert["spec"]["usages"][0] == "server auth"
    monitors = _of(docs, "ServiceMonitor")
    assert len(monitors) == len(cfg.trust_domains) + 1
    assert all(m["metadata"]["labels"]["release"] == "prometheus" for m in monitors)
    roles = {m["spec"]["endpoints"][0]["relabelings"][0]["replacement"] for m in monitors}
    assert roles == {"coordinator", "participant"}  # the label the alert rules select on
    (rule,) = _of(docs, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(alert_rules_text())
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    dashboards = [
        c for c in _of(docs, "ConfigMap") if "grafana_dashboard" in c["metadata"]["labels"]
    ]
    (dashboard,) = dashboards
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = dashboard["data"].values()
    assert json.loads(text)["uid"] == "lensemble-federation"
    (deployment,) = _of(docs, "Deployment")
    _, spec = _pod(deployment)
    assert spec["runtimeClassName"] == "kata-cc-snp"
    assert spec["nodeSelector"] == {"lensemble.dev/confidential-compute": "true"}


@pytest.mark.parametrize("scheduler", ["kueue", "volcano"])
def test_gang_scheduling_never_groups_participants(scheduler: str) -> None:
    case = f"helm-sovereign-prod-gpu-{scheduler}"
    cfg = config_of(case)
    for sts in _of(render(case), "StatefulSet"):
        meta, spec = _pod(sts)
        gpus = cfg.deployment.resources.participant.gpu
        assert _container(sts)["resources"]["limits"]["nvidia.com/gpu"] == gpus
        # The StatefulSet itself is never queued as one group; each pod is its own workload.
        assert not any(k.startswith(("kueue.", "scheduling.")) for k in sts["metadata"]["labels"])
        grouping = [k for k in {**meta["labels"], **meta["annotations"]} if "group" in k]
        assert grouping == []
        if scheduler == "kueue":
            assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "lensemble"
        else:
            assert spec["schedulerName"] == "volcano"
            assert meta["annotations"]["scheduling.volcano.sh/queue-name"] == "research"


def test_no_gang_annotations_with_one_gpu_or_none() -> None:
    for sts in _of(render("helm-sovereign-prod"), "StatefulSet"):
        meta, spec = _pod(sts)
        assert "schedulerName" not in spec
        assert not any(
            "kueue" in k or "volcano" in k for k in {**meta["labels"], **meta["annotations"]}
        )
