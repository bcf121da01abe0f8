"""The chart's generated ``README.md``, from the comments of its hand-written ``values.yaml``.

``values.yaml`` has a ``# --`` comment above every key (the helm-docs convention);
:func:`render_readme` turns those comments into the README's values table. ``values.yaml`` has
no default ``config:``: Helm would merge its mappings into every release's config. The README is
in ``tools/regenerate.py``'s registry, so a test fails when it drifts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

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


def _with_comment(line: str, pending: list[str] | None) -> tuple[bool, list[str] | None]:
    """Whether ``line`` is a ``# --`` comment (or its continuation), and the comment so far."""
    doc, more = _DOC.match(line), _MORE.match(line)
    if doc:
        return True, [doc["text"].strip()]
    if more:
        return True, None if pending is None else [*pending, more["text"].strip()]
    return False, pending


def _nested(stack: list[tuple[int, str]], indent: int, name: str) -> tuple[str, ...] | None:
    """The path of key ``name`` at ``indent`` (``stack`` follows); None under ``config:``."""
    while stack and stack[-1][0] >= indent:
        stack.pop()
    if stack and stack[0][1] == CONFIG_KEY:
        return None
    stack.append((indent, name))
    return tuple(key for _, key in stack)


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
        comment, pending = _with_comment(line, pending)
        if comment:
            continue
        item, key = _ITEM.match(line), _KEY.match(line)
        if item:
            list_indent = len(item["indent"])
        if not line.strip() or item or not key:
            pending = None
            continue
        indent = len(key["indent"])
        if list_indent is not None and indent > list_indent:
            continue  # a key inside a list item belongs to the item's value
        list_indent = None
        path = _nested(stack, indent, key["key"].strip().strip("\"'"))
        if path is not None:
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
            default = "required: `lensemble render helm-values`"
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
            "<!-- Generated from values.yaml by python -m tools.regenerate: do not edit. -->",
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
            "Service (gRPC, model download, health, metrics), a PodDisruptionBudget, native gRPC "
            "liveness and readiness probes on the plaintext health port.",
            "- **Participants** (modes `all`, `participant`): one StatefulSet per trust domain "
            "(`replicas` = its participants; pod `<name>-<i>` is its i-th participant), a headless "
            "Service, a private data volume per pod (`volumeClaimTemplates`), node placement "
            "from `config.deployment.trust_domains`.",
            "- **Security by default**: a ServiceAccount per role and trust domain without a "
            "token; non-root, read-only root filesystem, no privilege escalation, all capabilities "
            "dropped, seccomp `RuntimeDefault`; namespaces labelled for Pod Security Admission "
            "`restricted`; default-deny NetworkPolicies; TLS only from Secrets.",
            "- A `helm test` pod that asks the coordinator's gRPC health service for readiness.",
            "- **Open files**: Kubernetes has no pod setting for `nofile`. Every process raises "
            "its soft limit to the hard limit the container runtime gives (Docker and containerd: "
            "often 524,288 or more) and logs both (`file_limit`); the coordinator caps its "
            "connections below it. Where the runtime's hard limit is low, raise it on the nodes "
            "(containerd's or Docker's `LimitNOFILE`).",
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
            "--trust-domain T` (see docs/how-to/kubernetes.md in the repository).",
            "",
            "## Values",
            "",
            "| Key | Type | Default | Description |",
            "|---|---|---|---|",
            *rows,
            "",
        ]
    )
