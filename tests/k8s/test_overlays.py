"""The Kustomize tree: small overlays over generated bases, differences from Helm exactly the
documented patches, no patch that overrides what the config says, and each environment's promises
(kind pinning, sovereign-prod isolation).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from lensemble.config.load import validate_mapping
from lensemble.render.helm_values import render_helm_values
from lensemble.render.k8s import (
    BASE_CONFIG,
    BASE_DIR,
    BASE_MANIFESTS,
    OVERLAYS_DIR,
    is_hook,
    parse_manifests,
    render_chart,
)
from lensemble.render.k8s_policy import workloads
from lensemble.render.kind import kind_cluster
from lensemble.render.names import TRUST_DOMAIN_LABEL, participant_namespace
from tests.k8s.renders import ENVS, REPO, config_of, render
from tests.support.tools import require

OVERLAYS = REPO / OVERLAYS_DIR
Docs = list[dict[str, Any]]


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("env", ENVS)
def test_overlays_are_small_kustomizations_over_their_base(env: str) -> None:
    kustomization = _load(OVERLAYS / env / "kustomization.yaml")
    assert kustomization["kind"] == "Kustomization"
    assert kustomization["resources"] == [BASE_DIR]
    assert "namespace" not in kustomization, "a namespace override would merge trust domains"
    for component in kustomization.get("components", []):
        path = (OVERLAYS / env / component).resolve()
        assert path.parent == OVERLAYS / "components"
        assert _load(path / "kustomization.yaml")["kind"] == "Component"
    base = _load(OVERLAYS / env / BASE_DIR / "kustomization.yaml")
    assert base["resources"] == [BASE_MANIFESTS]
    # The config is written once; every workload's ConfigMap refers to it.
    assert {tuple(g["files"]) for g in base["configMapGenerator"]} == {(BASE_CONFIG,)}


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


def test_local_overlay_is_the_chart_as_the_config_says() -> None:
    """Local needs no patch: pull policy and resources come from the config."""
    cfg = config_of("kustomize-local")
    assert _patches(OVERLAYS / "local") == []
    workers = [
        node["labels"]
        for node in _load(REPO / "overlays/local/kind-cluster.yaml")["nodes"]
        if node["role"] == "worker"
    ]
    assert sorted(w[TRUST_DOMAIN_LABEL] for w in workers) == sorted(cfg.trust_domains)
    resources = cfg.deployment.resources
    for _doc, meta, spec in workloads(render("kustomize-local")):
        container = spec["containers"][0]
        assert container["imagePullPolicy"] == cfg.deployment.image.pull_policy == "Never"
        role = meta["labels"]["app.kubernetes.io/component"]
        assert container["resources"]["requests"]["cpu"] == getattr(resources, role).cpu


def test_a_config_pinning_its_trust_domains_lands_each_on_its_kind_worker() -> None:
    """The kind workers carry what a config's placement asks for, so the chart's own
    nodeSelector pins each trust domain to exactly its worker (no overlay patch)."""
    require("helm")
    base = config_of("helm-local").model_dump(mode="json")
    base["deployment"]["trust_domains"] = {
        td: {"node_selector": {TRUST_DOMAIN_LABEL: td, "example.org/site": f"site-{td}"}}
        for td in config_of("helm-local").trust_domains
    }
    cfg = validate_mapping(base, source="<pinned>")
    workers = [n["labels"] for n in kind_cluster(cfg)["nodes"] if n["role"] == "worker"]
    seen = set()
    for _doc, meta, spec in workloads(render_chart(render_helm_values(cfg))):
        td = meta["labels"].get(TRUST_DOMAIN_LABEL)
        if td:
            selector = spec["nodeSelector"].items()
            assert [w[TRUST_DOMAIN_LABEL] for w in workers if selector <= w.items()] == [td]
            seen.add(td)
    assert seen == set(cfg.trust_domains)


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


# ------------------------------------------------- no patch overrides what the config says
def _build(directory: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    proc = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return _by_key(parse_manifests(proc.stdout, str(directory)))


def _units(overlay: Path) -> list[tuple[str, dict[str, Any]]]:
    """Each component of an overlay, and its own patches, as a kustomization of its own."""
    kustomization = _load(overlay / "kustomization.yaml")
    units = [(c, {"components": [c]}) for c in kustomization.get("components", [])]
    if kustomization.get("patches"):
        units.append(("patches", {"patches": kustomization["patches"]}))
    return units


def overriding_changes(tree: Path, env: str) -> list[str]:
    """Fields of the base that a patch of ``overlays/<env>`` changes, one line each.

    Every component (and the overlay's own patches) is applied alone to the base; a patch may
    add fields the base lacks, but a field the base has came from the config (or the chart
    rendering it), so changing it contradicts the config. A patch that changes nothing at all
    repeats the base and is reported too.
    """
    base = _build(tree / env / BASE_DIR)
    overlay = tree / env
    out = []
    for name, unit in _units(overlay):
        # A sibling of the overlay (with a copy of its base), so its relative paths resolve alike.
        probe = tree / f"{env}-probe"
        shutil.rmtree(probe, ignore_errors=True)
        shutil.copytree(overlay, probe)
        document = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [BASE_DIR],
            **unit,
        }
        (probe / "kustomization.yaml").write_text(yaml.safe_dump(document), encoding="utf-8")
        patched = _build(probe)
        shutil.rmtree(probe)
        changed = False
        for key, before in base.items():
            old, new = _leaves(before), _leaves(patched[key])
            for pointer in sorted(old.keys() | new.keys()):
                if old.get(pointer, ...) == new.get(pointer, ...):
                    continue
                changed = True
                if pointer in old:
                    out.append(f"{name}: {key}: {pointer}: {old[pointer]} -> {new.get(pointer)}")
        if not changed:
            out.append(f"{name}: changes nothing the base does not already say")
    return out


@pytest.mark.parametrize("env", ENVS)
def test_no_overlay_patch_overrides_the_config(env: str, tmp_path: Path) -> None:
    require("kubectl")
    tree = tmp_path / "overlays"
    shutil.copytree(OVERLAYS, tree)
    assert overriding_changes(tree, env) == []


def _local_overlay_with(tree: Path, path: str, value: str) -> None:
    """Make the local overlay use one component that sets ``path`` of every StatefulSet."""
    component = tree / "components" / "probe"
    component.mkdir()
    patch = yaml.safe_dump([{"op": "replace", "path": path, "value": value}])
    document = {
        "apiVersion": "kustomize.config.k8s.io/v1alpha1",
        "kind": "Component",
        "patches": [{"target": {"kind": "StatefulSet"}, "patch": patch}],
    }
    (component / "kustomization.yaml").write_text(yaml.safe_dump(document), encoding="utf-8")
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [BASE_DIR],
        "components": ["../components/probe"],
    }
    (tree / "local/kustomization.yaml").write_text(yaml.safe_dump(overlay), encoding="utf-8")


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        # What the local overlay did before: CPU requests of 100m where the config says 500m.
        (
            "/spec/template/spec/containers/0/resources/requests/cpu",
            "100m",
            "/spec/template/spec/containers/0/resources/requests/cpu: 500m -> 100m",
        ),
        # And a pull-policy patch that repeated the config's.
        (
            "/spec/template/spec/containers/0/imagePullPolicy",
            "Never",
            "changes nothing the base does not already say",
        ),
    ],
)
def test_a_patch_against_the_config_is_found(
    tmp_path: Path, path: str, value: str, expected: str
) -> None:
    require("kubectl")
    tree = tmp_path / "overlays"
    shutil.copytree(OVERLAYS, tree)
    _local_overlay_with(tree, path, value)
    found = overriding_changes(tree, "local")
    assert found, "the patch went unnoticed"
    assert all(line.endswith(expected) for line in found), found
