"""Generated files of the chart: ``README.md``, ``values.schema.json`` and the default ``config:``.

``values.yaml`` is written by hand with a ``# --`` comment above every key (the helm-docs
convention); :func:`render_readme` turns those comments into the README's values table. The
default ``config:`` block (the last key of ``values.yaml``) is the container view of the packaged
``config/local.yaml``, so a bare ``helm install`` deploys the kind quick start. Tests fail when any
of the three drifts; ``scripts/regenerate-k8s.sh`` rewrites them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lensemble.config.load import PACKAGED_DEFAULT, load_config
from lensemble.render.chart_values import values_schema_text
from lensemble.render.helm_values import render_helm_values

CONFIG_KEY = "config"
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[^\s#\-][^:]*):(\s|$)")
_DOC = re.compile(r"^ *# -- ?(?P<text>.*)$")
_ITEM = re.compile(r"^(?P<indent> *)- ")
_MORE = re.compile(r"^ *# ?(?P<text>.*)$")


@dataclass(frozen=True)
class ValueDoc:
    """One documented key of ``values.yaml``.

    Attributes:
        path: Keys from the root, e.g. ``("networkPolicy", "dns", "namespace")``.
        description: The ``# --`` comment above the key (empty when missing).
        line: 1-based line of the key.
    """

    path: tuple[str, ...]
    description: str
    line: int


def value_docs(text: str) -> list[ValueDoc]:
    """Every key of a values file with its ``# --`` comment, in file order.

    Keys under ``config:`` are not listed: the config documents itself
    (``docs/config-reference.md``). List items are part of their key's value.
    """
    out: list[ValueDoc] = []
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    list_indent: int | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            pending = None
            continue
        doc, more = _DOC.match(line), _MORE.match(line)
        if doc:
            pending = [doc["text"].strip()]
            continue
        if more:
            if pending is not None:
                pending.append(more["text"].strip())
            continue
        item = _ITEM.match(line)
        if item:
            list_indent, pending = len(item["indent"]), None
            continue
        key = _KEY.match(line)
        if not key:
            pending = None
            continue
        indent = len(key["indent"])
        if list_indent is not None and indent > list_indent:
            continue  # a key inside a list item belongs to the item's value
        list_indent = None
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if stack and stack[0][1] == CONFIG_KEY:
            pending = None
            continue
        stack.append((indent, key["key"].strip().strip("\"'")))
        path = tuple(name for _, name in stack)
        out.append(ValueDoc(path, " ".join(pending or []).strip(), number))
        pending = None
    return out


def undocumented(text: str) -> list[str]:
    """Dotted paths of keys that have no ``# --`` comment."""
    return [".".join(d.path) for d in value_docs(text) if not d.description]


def _lookup(values: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = values
    for key in path:
        node = node[key]
    return node


def _type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    return "object"


def render_readme(chart: Path) -> str:
    """The chart's ``README.md``: what it deploys, how to install it, and every value.

    Args:
        chart: The chart directory (``Chart.yaml`` and ``values.yaml`` are read).

    Returns:
        Markdown text.
    """
    meta = yaml.safe_load((chart / "Chart.yaml").read_text(encoding="utf-8"))
    text = (chart / "values.yaml").read_text(encoding="utf-8")
    values = yaml.safe_load(text)
    rows = []
    for doc in value_docs(text):
        value = _lookup(values, doc.path)
        key = ".".join(f'"{p}"' if "." in p else p for p in doc.path)
        if doc.path == (CONFIG_KEY,):
            default = "container view of `config/local.yaml`"
        elif isinstance(value, dict) and value:
            default = ""
        else:
            default = f"`{json.dumps(value)}`"
        description = doc.description.replace("|", "\\|")
        rows.append(f"| `{key}` | {_type(value)} | {default} | {description} |")
    return "\n".join(
        [
            f"# {meta['name']}",
            "",
            "<!-- Generated from values.yaml by scripts/regenerate-k8s.sh: do not edit. -->",
            "",
            f"Version {meta['version']}, app version {meta['appVersion']}, Kubernetes "
            f"{meta['kubeVersion']}.",
            "",
            str(meta["description"]).strip(),
            "",
            "## What it deploys",
            "",
            "- **Coordinator** (modes `all`, `coordinator`): a Deployment with one replica and "
            "the `Recreate` strategy, a PersistentVolumeClaim for checkpoints and the ledger, a "
            "Service "
            "(gRPC, health, metrics), a PodDisruptionBudget, native gRPC liveness and readiness "
            "probes on the plaintext health port.",
            "- **Participants** (modes `all`, `participant`): one StatefulSet per trust domain "
            "(`replicas` = its participants; pod `<name>-<i>` is its i-th participant), a headless "
            "Service, a private data volume per pod (`volumeClaimTemplates`), node placement "
            "from `config.deployment.trust_domains`.",
            "- **Security by default**: a ServiceAccount per role and trust domain without a "
            "token; non-root, read-only root filesystem, no privilege escalation, all capabilities "
            "dropped, seccomp `RuntimeDefault`; namespaces labelled for Pod Security Admission "
            "`restricted`; default-deny NetworkPolicies; TLS only from Secrets.",
            "- A `helm test` pod that asks the coordinator's gRPC health service for readiness.",
            "",
            "## Install",
            "",
            "```bash",
            "lensemble render helm-values --config config/staging.yaml -o values-staging.yaml",
            "helm install lensemble-staging charts/lensemble -f values-staging.yaml",
            "helm test lensemble-staging",
            "```",
            "",
            "One organisation per release: `--mode coordinator`, or `--mode participant "
            "--trust-domain T` (see the repository README, section Kubernetes).",
            "",
            "## Values",
            "",
            "| Key | Type | Default | Description |",
            "|---|---|---|---|",
            *rows,
            "",
        ]
    )


def default_config() -> dict[str, Any]:
    """The chart's default ``config:``: the container view of the packaged local config."""
    values = render_helm_values(load_config(PACKAGED_DEFAULT))
    config: dict[str, Any] = values["config"]
    return config


def values_with_default_config(text: str) -> str:
    """``values.yaml`` text with its trailing ``config:`` block regenerated.

    Raises:
        ValueError: ``config:`` is not the file's last top-level key.
    """
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(rf"^{CONFIG_KEY}:(\s|$)", line)]
    if len(starts) != 1:
        raise ValueError("values.yaml must have exactly one top-level 'config:' key, last")
    start = starts[0]
    if any(re.match(r"^[^\s#]", line) for line in lines[start + 1 :]):
        raise ValueError("'config:' must be the last top-level key of values.yaml")
    block = yaml.safe_dump(default_config(), sort_keys=False, width=100)
    body = "\n".join("  " + line for line in block.splitlines())
    return "\n".join([*lines[:start], f"{CONFIG_KEY}:", body]) + "\n"


def regenerate(chart: Path) -> list[Path]:
    """Rewrite the chart's generated files (schema, default config, README) in place.

    Returns:
        The files whose content changed.
    """
    changed = []
    values = chart / "values.yaml"
    targets: list[tuple[Path, str]] = [
        (chart / "values.schema.json", values_schema_text()),
        (values, values_with_default_config(values.read_text(encoding="utf-8"))),
    ]
    for path, text in targets:
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    readme = chart / "README.md"
    text = render_readme(chart)
    if not readme.is_file() or readme.read_text(encoding="utf-8") != text:
        readme.write_text(text, encoding="utf-8")
        changed.append(readme)
    return changed
