"""Kubernetes manifests: the chart rendered with Helm v4, then an environment's Kustomize overlay.

Helm runs in-process through the ``helm-python-sdk`` wheel (``helm_python``, Helm's own Go SDK;
no ``helm`` binary), Kustomize through ``kubectl kustomize``. Both are reached only inside these
functions, so importing this module is cheap.

Layout the functions rely on (the Kustomize tree is ``overlays/`` of the checkout)::

    charts/lensemble/                           the chart
    overlays/<env>/kustomization.yaml           one overlay per environment: what a user applies
    overlays/<env>/base/manifests.yaml          the chart rendered with config/<env>.yaml,
    overlays/<env>/base/config.yaml             its config, once (ConfigMaps refer to it),
    overlays/<env>/base/kustomization.yaml      and their kustomization (all generated)
    overlays/components/<feature>/              Components: what a config cannot say
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lensemble.config.schema import Environment, LensembleConfig
from lensemble.errors import ConfigError, ConfigProblem, ToolMissing, UsageError
from lensemble.render.helm_values import render_helm_values

#: The Kustomize tree (one overlay per environment), relative to the checkout.
OVERLAYS_DIR = Path("overlays")
#: The folder of an overlay that holds its generated base.
BASE_DIR = "base"
#: The files of one environment's base (all generated), relative to ``<env>/base``.
BASE_MANIFESTS = "manifests.yaml"
BASE_CONFIG = "config.yaml"
BASE_KUSTOMIZATION = "kustomization.yaml"
HOOK_ANNOTATION = "helm.sh/hook"
#: The key under which every lensemble ConfigMap holds the container config.
CONFIG_MAP_KEY = "config.yaml"

#: Install order (kinds first in this list apply first); other kinds follow, sorted by name.
_KIND_ORDER = (
    "Namespace",
    "NetworkPolicy",
    "ServiceAccount",
    "Secret",
    "ConfigMap",
    "PersistentVolumeClaim",
    "Service",
    "Certificate",
    "Deployment",
    "PodGroup",
    "StatefulSet",
    "PodDisruptionBudget",
    "ServiceMonitor",
    "Pod",
)

Manifest = dict[str, Any]


@dataclass(frozen=True)
class RenderedK8s:
    """One environment's manifests along both paths.

    Attributes:
        helm: Every document the chart renders (``helm template``), test hooks included.
        manifests: The final manifests: the chart without hooks, through the overlay.
    """

    helm: list[Manifest]
    manifests: list[Manifest]


def repo_root() -> Path:
    """The checkout this package runs from (editable install) or the working directory."""
    here = Path(__file__).resolve().parents[3]
    return here if (here / "charts" / "lensemble").is_dir() else Path.cwd()


def chart_dir(path: Path | None = None) -> Path:
    """The chart directory: ``path``, else ``charts/lensemble`` of the checkout.

    Raises:
        UsageError: There is no ``Chart.yaml`` there.
    """
    chart = path if path is not None else repo_root() / "charts" / "lensemble"
    if not (chart / "Chart.yaml").is_file():
        raise UsageError(
            f"{chart}/Chart.yaml does not exist.",
            remediation="Run from the repository root or pass --chart charts/lensemble.",
        )
    return chart


def overlays_dir(path: Path | None = None) -> Path:
    """The Kustomize tree: ``path``, else ``overlays`` of the checkout.

    It holds ``<env>/kustomization.yaml`` with ``<env>/base/`` (generated), and ``components/``.

    Raises:
        UsageError: It has no ``<env>/kustomization.yaml``.
    """
    tree = path if path is not None else repo_root() / OVERLAYS_DIR
    if not any(tree.glob("*/kustomization.yaml")):
        raise UsageError(
            f"{tree} holds no overlay (no {tree}/<env>/kustomization.yaml).",
            remediation=f"Run from the repository root or pass --overlays {OVERLAYS_DIR}.",
        )
    return tree


def _sort_key(doc: Manifest) -> tuple[int, str, str, str]:
    kind = str(doc.get("kind", ""))
    rank = _KIND_ORDER.index(kind) if kind in _KIND_ORDER else len(_KIND_ORDER)
    meta = doc.get("metadata") or {}
    return rank, kind, str(meta.get("namespace", "")), str(meta.get("name", ""))


def parse_manifests(text: str, source: str) -> list[Manifest]:
    """Parse a multi-document YAML stream, dropping empty documents.

    Raises:
        UsageError: The text is not YAML, or a document is not a mapping with ``kind``.
    """
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise UsageError(f"{source} is not valid YAML: {exc}") from None
    for doc in docs:
        if not isinstance(doc, dict) or "kind" not in doc:
            raise UsageError(f"{source} holds a document that is not a Kubernetes object.")
    return docs


def is_hook(doc: Manifest) -> bool:
    """Whether a document is a Helm hook (e.g. the ``helm test`` pod)."""
    annotations = (doc.get("metadata") or {}).get("annotations") or {}
    return HOOK_ANNOTATION in annotations


def dump_manifests(docs: Iterable[Manifest], header: str = "") -> str:
    """Documents as one YAML stream, ``---`` separated, with an optional comment header."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    body = "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs)
    return ("\n".join(lines) + "\n" if lines else "") + body


_SCHEMA_LINE = re.compile(r"at '(?P<pointer>/[^']*)': (?P<why>.*)")


def _helm_values_problems(message: str, source: str) -> list[ConfigProblem]:
    """One problem per ``- at '/a/b': why`` line of a Helm schema error."""
    problems = []
    matches = list(_SCHEMA_LINE.finditer(message))
    # "'allOf' failed" and the like only say that a nested line below failed: keep those, or
    # else the deepest of the lines, once per value.
    generic = r"'\w+' failed|validation failed"
    specific = [m for m in matches if not re.fullmatch(generic, m["why"].strip())]
    pointers = [m["pointer"] for m in matches]
    deepest = {
        m["pointer"]: m
        for m in matches
        if not any(p.startswith(m["pointer"] + "/") for p in pointers)
    }
    for match in specific or list(deepest.values()):
        parts = [p.replace("~1", "/").replace("~0", "~") for p in match["pointer"][1:].split("/")]
        path = ""
        for part in parts:
            path += f"[{part}]" if part.isdigit() else (f".{part}" if path else part)
        problems.append(
            ConfigProblem(path, f"{match['why'].strip()} (charts/lensemble/values.schema.json).")
        )
    if not problems:
        problems.append(ConfigProblem("", message.strip(), source=source))
    return [ConfigProblem(p.path, p.message, source=source) for p in problems]


def render_chart(
    values: dict[str, Any],
    *,
    chart: Path | None = None,
    namespace: str = "default",
    source: str = "<values>",
) -> list[Manifest]:
    """Render the chart with Helm v4 (``helm template``), validating ``values`` first.

    Args:
        values: Helm values, e.g. from :func:`~lensemble.render.helm_values.render_helm_values`.
        chart: Chart directory (default ``charts/lensemble`` of the checkout).
        namespace: Release namespace (objects carry their own namespaces from the config).
        source: Name of the values' origin, used in error messages.

    Returns:
        Every rendered document (hooks included), in install order.

    Raises:
        ToolMissing: The ``helm-python-sdk`` wheel is not installed.
        ConfigError: Helm's schema validation rejected the values (one problem per field).
        UsageError: The chart does not load, or a template refused the values.
    """
    try:
        import helm_python
    except ImportError:
        raise ToolMissing(
            "Helm's library (the helm-python-sdk wheel) is not installed.",
            remediation="pip install 'lensemble[dev]' or pip install helm-python-sdk.",
        ) from None
    directory = chart_dir(chart)
    release = str(values.get("config", {}).get("run", {}).get("name") or "lensemble")
    try:
        with helm_python.Chart.load(directory) as loaded:
            rendered = loaded.render(values, name=release, namespace=namespace, is_install=True)
    except helm_python.HelmValuesError as exc:
        raise ConfigError(_helm_values_problems(str(exc), source)) from None
    except helm_python.HelmChartLoadError as exc:
        raise UsageError(f"{directory} is not a loadable chart: {exc}") from None
    except helm_python.HelmError as exc:
        # Template `fail` messages start with the offending value's path.
        detail = str(exc).split("error calling fail: ")[-1].strip()
        detail = re.sub(r"^.*?execution error at \([^)]*\): ", "", detail)
        raise UsageError(f"{source}: {detail}") from None
    docs: list[Manifest] = []
    for name in sorted(rendered):
        if name.endswith("NOTES.txt"):
            continue
        docs.extend(parse_manifests(rendered[name], name))
    return sorted(docs, key=_sort_key)


def kustomize(overlay: Path, *, kubectl: str = "kubectl") -> list[Manifest]:
    """Build an overlay with ``kubectl kustomize``.

    Raises:
        ToolMissing: kubectl is not on PATH.
        UsageError: Kustomize rejected the overlay (the message carries kubectl's error).
    """
    exe = shutil.which(kubectl)
    if exe is None:
        raise ToolMissing(
            f"{kubectl} is not on PATH; it builds the Kustomize overlays.",
            remediation="Install kubectl (https://kubernetes.io/docs/tasks/tools/).",
        )
    proc = subprocess.run(
        [exe, "kustomize", str(overlay)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise UsageError(
            f"kubectl kustomize rejected {overlay}/kustomization.yaml: "
            f"{proc.stderr.strip() or proc.stdout.strip()}"
        )
    return parse_manifests(proc.stdout, f"kubectl kustomize {overlay}")


def _generated_note(env: str) -> str:
    return (
        f"The lensemble chart rendered with config/{env}.yaml (mode all, hooks left out).\n"
        "Generated: do not edit. Regenerate with: python -m tools.regenerate"
    )


def _config_maps(docs: list[Manifest]) -> tuple[list[Manifest], str]:
    """The chart's config ConfigMaps, and the one config text they all hold."""
    maps = [
        d for d in docs if d["kind"] == "ConfigMap" and set(d.get("data") or {}) == {CONFIG_MAP_KEY}
    ]
    texts = {d["data"][CONFIG_MAP_KEY] for d in maps}
    if len(texts) != 1:
        raise UsageError(
            f"the chart rendered {len(maps)} config ConfigMaps holding {len(texts)} different "
            "configs; every workload must read the same config (a bug in the chart)."
        )
    return maps, texts.pop()


def base_files(
    config: LensembleConfig, env: Environment | str, *, chart: Path | None = None
) -> tuple[list[Manifest], dict[str, str]]:
    """The chart rendered for ``config``, and the generated files of ``<env>/base``.

    The base holds the config once: every workload's ConfigMap is made by Kustomize's
    ``configMapGenerator`` from ``config.yaml``, so ``kubectl kustomize`` of the base yields
    exactly the chart's objects without the config written out once per workload.

    Returns:
        Every Helm document (hooks included), and file texts by name: ``manifests.yaml`` (the
        chart without hooks, which ``kubectl apply -k`` cannot run, and without the config
        ConfigMaps), ``config.yaml`` and ``kustomization.yaml``.

    Raises:
        UsageError: See :func:`render_chart`.
        ConfigError: See :func:`render_chart`.
        ToolMissing: See :func:`render_chart`.
    """
    helm = render_chart(render_helm_values(config), chart=chart, source=f"config for {env}")
    installed = [d for d in helm if not is_hook(d)]
    maps, config_text = _config_maps(installed)
    labels = [d["metadata"]["labels"] for d in maps]
    shared = {k: v for k, v in labels[0].items() if all(own.get(k) == v for own in labels)}
    generators = [
        {
            "name": d["metadata"]["name"],
            "namespace": d["metadata"]["namespace"],
            "files": [BASE_CONFIG],
            "options": {"labels": {k: v for k, v in own.items() if k not in shared}},
        }
        for d, own in zip(maps, labels, strict=True)
    ]
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [BASE_MANIFESTS],
        "generatorOptions": {"disableNameSuffixHash": True, "labels": shared},
        "configMapGenerator": generators,
    }
    note = _generated_note(str(env))
    files = {
        BASE_MANIFESTS: dump_manifests([d for d in installed if d not in maps], note),
        BASE_CONFIG: config_text,
        BASE_KUSTOMIZATION: dump_manifests([kustomization], note),
    }
    return helm, files


def _overlay(tree: Path, env: str) -> Path:
    overlay = tree / env
    if not (overlay / "kustomization.yaml").is_file():
        known = sorted(p.parent.name for p in tree.glob("*/kustomization.yaml"))
        raise UsageError(
            f"{overlay}/kustomization.yaml does not exist.",
            remediation=f"Use --env with one of: {', '.join(known)}.",
        )
    return overlay


def render_k8s(
    config: LensembleConfig,
    env: Environment | str,
    *,
    chart: Path | None = None,
    overlays: Path | None = None,
) -> RenderedK8s:
    """Render the chart for ``config`` and build the overlay ``<env>`` over it.

    The Kustomize tree (``overlays`` or ``overlays/`` of the checkout) is copied to a temporary
    directory and ``<env>/base`` replaced with this config's (:func:`base_files`), so the
    committed files are never touched.

    Raises:
        UsageError: ``env`` has no overlay, or Helm or Kustomize refused the input.
        ConfigError: Helm's schema validation rejected the values.
        ToolMissing: Helm's library or kubectl is missing.
    """
    tree = overlays_dir(overlays)
    _overlay(tree, str(env))
    helm, files = base_files(config, env, chart=chart)
    with tempfile.TemporaryDirectory(prefix="lensemble-k8s-") as tmp:
        copy = Path(tmp) / "overlays"
        shutil.copytree(tree, copy)
        base = copy / str(env) / BASE_DIR
        base.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (base / name).write_text(text, encoding="utf-8")
        manifests = kustomize(copy / str(env))
    return RenderedK8s(helm=helm, manifests=manifests)


def write_manifests(docs: Sequence[Manifest], directory: Path, env: str) -> Path:
    """Write the final manifests to ``directory/lensemble-<env>.yaml``.

    Returns:
        The path written.
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"lensemble-{env}.yaml"
    path.write_text(dump_manifests(docs), encoding="utf-8")
    return path


def env_from_config(config: LensembleConfig, env: str | None) -> str:
    """The overlay to use: ``env``, which must match ``deployment.environment`` when given.

    Raises:
        UsageError: ``env`` differs from the config's environment.
    """
    own = config.deployment.environment
    if env is None:
        return own
    if env != own:
        raise UsageError(
            f"--env {env} does not match deployment.environment '{own}' of the config.",
            remediation=f"Pass --env {own}, or a config written for {env}.",
        )
    return env
