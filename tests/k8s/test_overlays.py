"""The Kustomize overlays: committed bases in sync, differences from Helm exactly the documented
patches, and each environment's promises (kind pinning, sovereign-prod isolation).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from lensemble.render.helm_values import participant_namespace
from lensemble.render.k8s import is_hook, overlay_files
from lensemble.render.k8s_policy import workloads
from lensemble.render.kind import kind_cluster
from tests.k8s.renders import ENVS, REPO, config_of, render
from tests.support.tools import require

OVERLAYS = REPO / "overlays"
Docs = list[dict[str, Any]]


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("env", ENVS)
def test_committed_generated_files_are_fresh(env: str) -> None:
    require("helm")
    _, files = overlay_files(config_of(f"helm-{env}"), env)
    for relative, text in files.items():
        committed = (OVERLAYS / env / relative).read_text(encoding="utf-8")
        assert committed == text, (
            f"overlays/{env}/{relative} is stale; run scripts/regenerate-k8s.sh "
            f"(or lensemble render k8s --config config/{env}.yaml --env {env} --update-base)"
        )


@pytest.mark.parametrize("env", ENVS)
def test_overlays_are_small_kustomizations_over_their_base(env: str) -> None:
    kustomization = _load(OVERLAYS / env / "kustomization.yaml")
    assert kustomization["kind"] == "Kustomization"
    assert kustomization["resources"] == ["base"]
    assert "namespace" not in kustomization, "a namespace override would merge trust domains"
    for component in kustomization.get("components", []):
        assert _load(OVERLAYS / env / component / "kustomization.yaml")["kind"] == "Component"
    base = _load(OVERLAYS / env / "base" / "kustomization.yaml")
    assert base["resources"] == ["manifests.yaml"]


# ------------------------------------------------------------ differences = documented patches
def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_leaves(value, f"{prefix}/{_escape(str(key))}"))
        return out
    if isinstance(node, list) and node:
        out = {}
        for i, value in enumerate(node):
            out.update(_leaves(value, f"{prefix}/{i}"))
        return out
    return {prefix: node}


@dataclass(frozen=True)
class Patch:
    """One documented change: which objects it may touch, and where."""

    source: str
    kind: str
    pointer: str
    label: tuple[str, str] | None = None
    name: str | None = None
    namespace: str | None = None

    def matches(self, doc: dict[str, Any]) -> bool:
        meta = doc["metadata"]
        labels = meta.get("labels") or {}
        return (
            doc["kind"] == self.kind
            and (self.label is None or labels.get(self.label[0]) == self.label[1])
            and self.name in (None, meta["name"])
            and self.namespace in (None, meta.get("namespace"))
        )

    def covers(self, doc: dict[str, Any], pointer: str) -> bool:
        return self.matches(doc) and (
            pointer == self.pointer or pointer.startswith(self.pointer + "/")
        )


def _patches(kustomization_dir: Path) -> list[Patch]:
    """Every patch of an overlay and of its components, as (target, JSON pointer) pairs."""
    kustomization = _load(kustomization_dir / "kustomization.yaml")
    out: list[Patch] = []
    for component in kustomization.get("components", []):
        out += _patches((kustomization_dir / component).resolve())
    for entry in kustomization.get("patches", []):
        source = str(kustomization_dir.relative_to(OVERLAYS))
        if "patch" in entry:  # inline JSON6902 with a target
            target = entry["target"]
            selector = target.get("labelSelector")
            label = tuple(selector.split("=", 1)) if selector else None
            for op in yaml.safe_load(entry["patch"]):
                out.append(Patch(source, target["kind"], op["path"], label, target.get("name")))
        else:  # strategic-merge documents in a file
            path = kustomization_dir / entry["path"]
            for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
                meta = doc["metadata"]
                body = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}
                for pointer in _leaves(body):
                    out.append(
                        Patch(
                            str(path.relative_to(OVERLAYS)),
                            doc["kind"],
                            pointer,
                            name=meta["name"],
                            namespace=meta.get("namespace"),
                        )
                    )
    return out


def _by_key(docs: Docs) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d for d in docs}


@pytest.mark.parametrize("env", ENVS)
def test_overlay_differs_from_helm_only_by_its_documented_patches(env: str) -> None:
    helm = _by_key([d for d in render(f"helm-{env}") if not is_hook(d)])
    overlay = _by_key(render(f"kustomize-{env}"))
    assert overlay.keys() == helm.keys(), "the overlay adds or drops objects"
    patches = _patches(OVERLAYS / env)
    assert patches, f"overlays/{env} documents no patch"
    undocumented = []
    for key, before in helm.items():
        after = overlay[key]
        a, b = _leaves(before), _leaves(after)
        for pointer in sorted(a.keys() | b.keys()):
            if a.get(pointer, ...) != b.get(pointer, ...) and not any(
                p.covers(after, pointer) for p in patches
            ):
                undocumented.append(f"{key}: {pointer}: {a.get(pointer)} -> {b.get(pointer)}")
    assert undocumented == []
    for patch in patches:
        assert any(patch.matches(doc) for doc in overlay.values()), f"{patch} matches nothing"


def test_local_overlay_pins_trust_domains_to_kind_workers() -> None:
    cfg = config_of("kustomize-local")
    workers = {
        node["labels"]["lensemble.dev/trust-domain"]
        for node in _load(OVERLAYS / "local" / "kind-cluster.yaml")["nodes"]
        if node["role"] == "worker"
    }
    assert workers == set(cfg.trust_domains)
    seen = set()
    for _doc, meta, spec in workloads(render("kustomize-local")):
        assert spec["containers"][0]["imagePullPolicy"] == "Never"
        assert spec["containers"][0]["resources"]["requests"]["cpu"] == "100m"
        td = meta["labels"].get("lensemble.dev/trust-domain")
        if td:
            assert spec["nodeSelector"] == {"lensemble.dev/trust-domain": td}
            seen.add(td)
    assert seen == workers


def test_kind_cluster_has_one_control_plane_and_a_worker_per_trust_domain() -> None:
    cfg = config_of("helm-staging")  # any config: the generator follows its trust domains
    cluster = kind_cluster(cfg)
    roles = [n["role"] for n in cluster["nodes"]]
    assert roles == ["control-plane"] + ["worker"] * len(cfg.trust_domains)
    assert cluster["apiVersion"] == "kind.x-k8s.io/v1alpha4"


# ----------------------------------------------------------------- sovereign-prod promises
@pytest.mark.parametrize("case", ["helm-sovereign-prod", "kustomize-sovereign-prod"])
def test_sovereign_prod_isolates_every_trust_domain(case: str) -> None:
    cfg = config_of(case)
    docs = render(case)
    namespaces = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Namespace"}
    for td in cfg.trust_domains:
        ns = participant_namespace(cfg, td)
        assert ns == f"{cfg.deployment.namespace.name}-{td}"
        labels = namespaces[ns]["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
        placement = cfg.deployment.trust_domains[td]
        (sts,) = [
            d
            for d in docs
            if d["kind"] == "StatefulSet"
            and d["metadata"]["labels"]["lensemble.dev/trust-domain"] == td
        ]
        assert sts["metadata"]["namespace"] == ns
        spec = sts["spec"]["template"]["spec"]
        assert spec["nodeSelector"] == placement.node_selector
        assert [t["key"] for t in spec["tolerations"]] == [t.key for t in placement.tolerations]
        terms = spec["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        other_domains = terms[0]
        assert other_domains["topologyKey"] == "kubernetes.io/hostname"
        assert other_domains["namespaceSelector"] == {}
        assert {"key": "lensemble.dev/trust-domain", "operator": "NotIn", "values": [td]} in (
            other_domains["labelSelector"]["matchExpressions"]
        )
        assert (
            terms[1]["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "coordinator"
        )
        # Each pod's data volume carries its trust domain (so only its pods mount it).
        (claim,) = sts["spec"]["volumeClaimTemplates"]
        assert claim["metadata"]["labels"]["lensemble.dev/trust-domain"] == td
        assert claim["spec"]["storageClassName"] == cfg.deployment.storage.class_name
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    spec = deployment["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"lensemble.dev/confidential-compute": "true"}
    terms = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms[0]["labelSelector"]["matchExpressions"] == [
        {"key": "lensemble.dev/trust-domain", "operator": "Exists"}
    ]
    if case.startswith("kustomize"):
        assert all(
            ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce-version"] == "v1.33"
            for ns in namespaces.values()
        )
        assert all(d.get("immutable") is True for d in docs if d["kind"] == "ConfigMap")


def test_confidential_runtime_class_only_when_configured() -> None:
    (deployment,) = [d for d in render("helm-sovereign-prod") if d["kind"] == "Deployment"]
    assert "runtimeClassName" not in deployment["spec"]["template"]["spec"]
    (featured,) = [d for d in render("helm-staging-features") if d["kind"] == "Deployment"]
    assert featured["spec"]["template"]["spec"]["runtimeClassName"] == "kata-cc-snp"
