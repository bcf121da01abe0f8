"""Import boundaries that import-linter (``lint-imports``, pyproject.toml) cannot express.

import-linter checks the layers, the base install's libraries and cycles; these tests check what
it cannot see: vendored code is imported only lazily and only by the two shims (also through
``importlib``), the vendor tool's imports are an allow-list, and every runtime package sits in
a layer of the contracts.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.vendor.imports import import_sites, package_modules

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
        "import lensemble, lensemble.cli, tools.vendor\n"
        "import lensemble.data.vendored_envs, lensemble.eval.vendored_planners\n"
        "from tools.vendor.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
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


def test_vendor_tool_imports_only_errors_stdlib_pydantic_packaging_and_typer(repo: Path) -> None:
    allowed_external = set(sys.stdlib_module_names) | {"pydantic", "packaging", "typer"}
    allowed_lensemble = {"lensemble", "lensemble.errors", "lensemble.cli.output"}
    package = repo / "tools" / "vendor"
    checked = 0
    for module, path in package_modules(package).items():
        for site in import_sites(path, package):
            top = site.target.split(".")[0]
            if top == "lensemble":
                assert site.target in allowed_lensemble, f"{module} imports {site.target}"
            elif top == "tools":
                assert site.target == "tools.entry" or site.target.startswith("tools.vendor"), (
                    f"{module} imports {site.target}"
                )
            else:
                assert top in allowed_external or top == "", f"{module} imports {site.target}"
            checked += 1
    assert checked > 20


def _layered_modules(repo: Path) -> set[str]:
    """Every module the layers contracts of ``[tool.importlinter]`` name, e.g. ``network``."""
    config = tomllib.loads((repo / "pyproject.toml").read_text(encoding="utf-8"))
    named: set[str] = set()
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract["type"] != "layers":
            continue
        assert contract["containers"] == ["lensemble"], contract["id"]
        for layer in contract["layers"]:
            for part in layer.replace("|", ":").split(":"):
                named.add(part.strip().strip("()"))
    return named


def test_every_runtime_package_sits_in_a_layer_contract(repo: Path) -> None:
    package = _package(repo)
    top_level = {
        p.stem if p.is_file() else p.name
        for p in package.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    assert {"cli", "config", "network", "render", "errors"} <= top_level
    missing = sorted(top_level - _layered_modules(repo))
    assert not missing, (
        f"lensemble.{missing[0]} is in no layer of [tool.importlinter] in pyproject.toml; add it "
        "to the training or deployment layers (and to the table in docs/architecture.md)."
    )


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["vendor", "sync", "--update", "stable-worldmodel==0.1.1"], "manages third_party/"),
        (["kind", "up", "--rounds", "2"], "builds the image, chart and overlays"),
    ],
)
def test_former_commands_point_at_the_checkout_tools(argv: list[str], what: str) -> None:
    result = run_cli(*argv)
    assert result.code == 2
    (line,) = result.err.strip().splitlines()
    assert line.startswith(f"error: `lensemble {argv[0]}` left the installed package: it {what}")
    assert line.endswith(
        f"run `python -m tools.{argv[0]} {' '.join(argv[1:])}` from the repository root."
    )
    assert f" {argv[0]} " not in run_cli("--help").out
