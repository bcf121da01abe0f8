"""Vendored code is reached only through the two shims, and the runtime's imports have no cycle."""

from __future__ import annotations

import graphlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.vendor.imports import import_sites, internal_graph, package_modules

SHIMS = {"lensemble.data.vendored_envs", "lensemble.eval.vendored_planners"}


def _vendored_names(repo: Path) -> set[str]:
    names: set[str] = set()
    for manifest in sorted((repo / "third_party").glob("*/vendor.toml")):
        names |= set(tomllib.loads(manifest.read_text())["upstream"]["import_names"])
    return names


def _package(repo: Path) -> Path:
    return repo / "runtime" / "lensemble"


def test_only_the_two_shims_import_vendored_code_and_only_lazily(repo: Path) -> None:
    vendored = _vendored_names(repo)
    assert vendored == {"stable_worldmodel", "stable_pretraining"}
    importers: dict[str, list[str]] = {}
    for module, path in package_modules(_package(repo)).items():
        for site in import_sites(path, _package(repo)):
            if site.target.split(".")[0] in vendored:
                importers.setdefault(module, []).append(site.target)
                assert site.in_function, f"{module} imports {site.target} at import time"
    assert set(importers) <= SHIMS, f"vendored code imported outside the shims: {importers}"
    # The shims really do reach the vendored code (so the check above is not vacuous).
    assert "stable_worldmodel.envs" in importers["lensemble.data.vendored_envs"]
    assert "stable_worldmodel.solver" in importers["lensemble.eval.vendored_planners"]


def test_lensemble_package_re_exports_nothing_vendored(repo: Path) -> None:
    code = (
        "import sys\n"
        "import lensemble, lensemble.cli, lensemble.vendor\n"
        "import lensemble.data.vendored_envs, lensemble.eval.vendored_planners\n"
        "from lensemble.cli import main\n"
        "sys.argv = ['lensemble', 'vendor', '--help']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in\n"
        "    ('stable_worldmodel', 'stable_pretraining', 'torch', 'gymnasium', 'grpc'))\n"
        "print('LOADED', loaded, 'ALL', sorted(lensemble.__all__))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=True
    )
    assert "LOADED [] ALL ['__version__']" in proc.stdout, proc.stdout + proc.stderr


def test_vendor_layer_imports_only_errors_stdlib_pydantic_and_packaging(repo: Path) -> None:
    allowed_external = set(sys.stdlib_module_names) | {"pydantic", "packaging"}
    package = _package(repo)
    checked = 0
    for module, path in package_modules(package).items():
        if not module.startswith("lensemble.vendor"):
            continue
        for site in import_sites(path, package):
            top = site.target.split(".")[0]
            if top == "lensemble":
                assert site.target in ("lensemble", "lensemble.errors") or site.target.startswith(
                    "lensemble.vendor"
                ), f"{module} imports {site.target}"
            else:
                assert top in allowed_external or top == "", f"{module} imports {site.target}"
            checked += 1
    assert checked > 20


def test_runtime_import_graph_has_no_cycles(repo: Path) -> None:
    graph = internal_graph(_package(repo))
    assert "lensemble.data.vendored_envs" in graph["lensemble.eval.vendored_planners"]
    assert "lensemble.vendor.fetch" in graph["lensemble.vendor.sync"]
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle in the runtime: {' -> '.join(exc.args[1])}")
    assert set(order) == set(graph)


def test_cycle_detection_catches_a_real_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import a\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n"
    )
    graph = internal_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.a"}  # lazy imports count
    assert graph["pkg.c"] == set()  # type-only imports do not
    with pytest.raises(graphlib.CycleError):
        list(graphlib.TopologicalSorter(graph).static_order())
