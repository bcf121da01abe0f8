"""Regenerate every committed generated file, or check that each one is fresh.

    python -m tools.regenerate            # rewrite every stale file, print what changed
    python -m tools.regenerate --check    # print the stale files; exit 1 when there are any

:data:`REGISTRY` lists each generated file with the function that produces its text from the
checkout; ``tests/test_generated.py`` checks every entry, so adding a generated file means adding
one entry here. Needs the development install (``pip install -e '.[dev]'``): Helm's library
renders the chart, grpcio-tools the gRPC stubs.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
#: What a generated file's header tells its reader to run.
COMMAND = "python -m tools.regenerate"
ENVIRONMENTS = ("local", "staging", "sovereign-prod")
PROTO = "runtime/lensemble/network/shared/proto"


@dataclass(frozen=True)
class Generated:
    """One committed generated file.

    Attributes:
        path: Path relative to the checkout.
        generate: Produces the file's text from the checkout root.
        tools: Names of ``tests.support.tools`` the generator needs (e.g. ``helm``).
    """

    path: str
    generate: Callable[[Path], str]
    tools: tuple[str, ...] = ()


# ------------------------------------------------------------------------------ the config
def _config_schema(root: Path) -> str:
    from lensemble.config.schema_export import json_schema_text

    return json_schema_text()


def _config_reference(root: Path) -> str:
    from lensemble.config.reference import render_reference

    return render_reference()


# ------------------------------------------------------------------------------- the chart
def _values_schema(root: Path) -> str:
    from lensemble.render.chart_values import values_schema_text

    return values_schema_text()


def _chart_rules(root: Path) -> str:
    from lensemble.render.chart_rules import rules_template

    return rules_template()


def _chart_readme(root: Path) -> str:
    from lensemble.render.chart_files import render_readme

    return render_readme(root / "charts/lensemble")


# ------------------------------------------------------------------ Kustomize bases, kind
@functools.cache
def _base(root: Path, env: str) -> dict[str, str]:
    from lensemble.config import load_config
    from lensemble.render.k8s import base_files

    config = load_config(root / "config" / f"{env}.yaml")
    return base_files(config, env, chart=root / "charts/lensemble")[1]


def _base_file(env: str, name: str) -> Callable[[Path], str]:
    return lambda root: _base(root, env)[name]


def _kind_cluster(root: Path) -> str:
    from lensemble.config import load_config
    from lensemble.render.kind import kind_cluster

    header = (
        "# kind cluster for the local overlay: one control plane, one worker per trust domain.\n"
        f"# Generated from config/local.yaml by {COMMAND}: do not edit.\n"
    )
    cluster = kind_cluster(load_config(root / "config/local.yaml"))
    return header + yaml.safe_dump(cluster, sort_keys=False)


# ------------------------------------------------------------------------------- Compose
@functools.cache
def _compose(root: Path) -> dict[str, str]:
    from lensemble.config import load_config
    from lensemble.render.compose_files import write_compose

    overrides = ["federation.transport=network"]
    config = load_config(root / "config/local.yaml", overrides)
    with tempfile.TemporaryDirectory(prefix="lensemble-regenerate-") as tmp:
        files = write_compose(
            config,
            Path(tmp) / "compose.yaml",
            command=COMMAND,
            source="config/local.yaml --set " + " --set ".join(overrides),
        )
        written = [files.compose, files.config, files.prometheus, files.alerts]
        return {path.name: path.read_text(encoding="utf-8") for path in written if path}


def _compose_file(name: str) -> Callable[[Path], str]:
    return lambda root: _compose(root)[name]


# ---------------------------------------------------------------------------- monitoring
def _alert_rules(root: Path) -> str:
    from lensemble.render.prometheus import alert_rules_text

    return alert_rules_text()


def _dashboard(root: Path) -> str:
    if str(root) not in sys.path:  # tools/ is a checkout package, not installed
        sys.path.insert(0, str(root))
    from tools.dashboard import dashboard_text

    return dashboard_text()


# ----------------------------------------------------------------------------- gRPC stubs
@functools.cache
def _stubs(root: Path) -> dict[str, str]:
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory(prefix="lensemble-protoc-") as tmp:
        out = Path(tmp)
        (out / PROTO).parent.mkdir(parents=True)
        (out / PROTO).mkdir()
        shutil.copy(root / PROTO / "lensemble.proto", out / PROTO)
        relative = PROTO.removeprefix("runtime/")
        code = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{out / 'runtime'}",
                f"--python_out={out / 'runtime'}",
                f"--pyi_out={out / 'runtime'}",
                f"--grpc_python_out={out / 'runtime'}",
                str(out / "runtime" / relative / "lensemble.proto"),
            ]
        )
        if code != 0:
            raise RuntimeError(f"grpc_tools.protoc failed on {PROTO}/lensemble.proto")
        return {p.name: p.read_text(encoding="utf-8") for p in (out / PROTO).glob("lensemble_pb2*")}


def _stub(name: str) -> Callable[[Path], str]:
    return lambda root: _stubs(root)[name]


REGISTRY: tuple[Generated, ...] = (
    Generated("config/lensemble.schema.json", _config_schema),
    Generated("docs/config-reference.md", _config_reference),
    Generated("charts/lensemble/values.schema.json", _values_schema),
    Generated("charts/lensemble/templates/_rules.tpl", _chart_rules),
    Generated("charts/lensemble/README.md", _chart_readme),
    Generated("charts/lensemble/files/alerts.yaml", _alert_rules),
    Generated("charts/lensemble/files/grafana-dashboard.json", _dashboard),
    *(
        Generated(f"overlays/{env}/base/{name}", _base_file(env, name), ("helm",))
        for env in ENVIRONMENTS
        for name in ("kustomization.yaml", "manifests.yaml", "config.yaml")
    ),
    Generated("overlays/local/kind-cluster.yaml", _kind_cluster),
    Generated("compose/compose.yaml", _compose_file("compose.yaml")),
    Generated("compose/lensemble.yaml", _compose_file("lensemble.yaml")),
    Generated("compose/prometheus.yml", _compose_file("prometheus.yml")),
    Generated("compose/alerts.yaml", _compose_file("alerts.yaml")),
    *(
        Generated(f"{PROTO}/{name}", _stub(name))
        for name in ("lensemble_pb2.py", "lensemble_pb2.pyi", "lensemble_pb2_grpc.py")
    ),
)


def regenerate(root: Path = ROOT, *, write: bool = True) -> list[str]:
    """Generate every registered file in registry order, writing each stale one at once.

    Writing at once matters: later generators read earlier files (the chart renders with the
    ``values.schema.json`` written just before).

    Returns:
        The paths that were stale (and, with ``write``, are now rewritten).
    """
    found = []
    for entry in REGISTRY:
        path = root / entry.path
        text = entry.generate(root)
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        found.append(entry.path)
        if write:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    return found


def main(argv: list[str] | None = None) -> int:
    """Rewrite (or with ``--check`` only list) the stale generated files; the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="list stale files; write nothing")
    args = parser.parse_args(argv)
    found = regenerate(ROOT, write=not args.check)
    for path in found:
        print(f"{'stale' if args.check else 'wrote'}: {path}")
    if not found:
        print(f"all {len(REGISTRY)} generated files are fresh")
    return 1 if args.check and found else 0


if __name__ == "__main__":
    sys.exit(main())
