"""mypy follows every module of the partly followed third-party packages that our code uses.

``[tool.mypy]`` in ``pyproject.toml`` skips the parts of a few large packages that none of our
code reaches (``follow_imports = "skip"``): on a cold cache every ``import pulumi_aws`` would
otherwise have mypy check all of AWS's services. A skipped module is ``Any`` to mypy, so code
that starts to use one would go unchecked without a word: this test names it instead.
"""

from __future__ import annotations

import ast
import functools
import re
import tomllib
from collections.abc import Iterable
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

#: Packages that mypy follows only in part.
PARTIAL = ("pulumi_aws", "pulumi_kubernetes", "gymnasium")


def mypy_settings() -> dict[str, Any]:
    with (REPO / "pyproject.toml").open("rb") as f:
        return dict(tomllib.load(f)["tool"]["mypy"])


def follow_imports(module: str, overrides: Iterable[dict[str, Any]]) -> str:
    """mypy's ``follow_imports`` for ``module``: an exact name wins, else the longest pattern."""
    best: tuple[int, int] | None = None
    value = "normal"
    for override in overrides:
        if "follow_imports" not in override:
            continue
        patterns = override["module"]
        for pattern in [patterns] if isinstance(patterns, str) else patterns:
            if pattern == module:
                rank = (1, len(pattern))
            elif pattern.endswith(".*") and f"{module}.".startswith(pattern[:-1]):
                rank = (0, len(pattern))
            else:
                continue
            if best is None or rank > best:
                best, value = rank, override["follow_imports"]
    return value


@functools.cache
def _source(module: str) -> Path | None:
    """The file of ``module`` (a package's ``__init__.py``), found without importing it."""
    root, *parts = module.split(".")
    spec = find_spec(root)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _defines(module: str, name: str) -> bool:
    path = _source(module)
    if path is None:
        return False
    pattern = rf"^(?:class|def) {re.escape(name)}\b|^{re.escape(name)}\s*[:=]"
    return re.search(pattern, path.read_text(encoding="utf-8"), re.MULTILINE) is not None


@functools.cache
def owner(package: str, name: str) -> str:
    """The module that defines ``package.name``: a submodule, or the module the package imports
    the name from (explicitly or by ``*``), else the package itself."""
    if _source(f"{package}.{name}") is not None:
        return f"{package}.{name}"
    path = _source(package)
    if path is None:
        return package
    for node in _parse(path).body:
        if not isinstance(node, ast.ImportFrom) or node.module is None:
            continue
        if node.level == 1:
            source = f"{package}.{node.module}"
        elif node.level == 0 and node.module.startswith(f"{package}."):
            source = node.module
        else:
            continue
        names = {alias.name for alias in node.names}
        if name in names or ("*" in names and _defines(source, name)):
            return source
    return package


def referenced_modules(tree: ast.AST) -> set[str]:
    """Modules of :data:`PARTIAL` packages that the code in ``tree`` imports or reaches."""
    aliases: dict[str, str] = {}
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PARTIAL:
                    used.add(alias.name)
                    bound = alias.asname or alias.name.split(".")[0]
                    aliases[bound] = alias.name if alias.asname else bound
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.split(".")[0] in PARTIAL
        ):
            used.add(node.module)
            for alias in node.names:
                used.add(owner(node.module, alias.name))
                if _source(f"{node.module}.{alias.name}") is not None:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        chain: list[str] = []
        base: ast.expr = node
        while isinstance(base, ast.Attribute):
            chain.insert(0, base.attr)
            base = base.value
        if not isinstance(base, ast.Name) or base.id not in aliases:
            continue
        module = aliases[base.id]
        for attr in chain:
            if _source(f"{module}.{attr}") is None:
                if module in PARTIAL:  # a name the package re-exports from one of its modules
                    used.add(owner(module, attr))
                break
            module = f"{module}.{attr}"
            used.add(module)
    return used


def _parse(path: Path) -> ast.Module:
    """``ast.parse`` of a file, tried once more on CPython 3.11's spurious SystemError.

    CPython 3.11.7 raised "AST constructor recursion depth mismatch" once in CI on a valid,
    generated pulumi_aws module (a check of the interpreter's own recursion counters, not of
    the source); the same source parses on the next call.
    """
    source = path.read_text(encoding="utf-8")
    try:
        return ast.parse(source)
    except SystemError:
        return ast.parse(source)


def test_mypy_follows_every_module_our_code_uses() -> None:
    settings = mypy_settings()
    used: set[str] = set()
    for folder in settings["files"]:
        for path in sorted((REPO / folder).rglob("*.py")):
            used |= referenced_modules(_parse(path))
    assert any(m.startswith("pulumi_aws.") for m in used), "the scan found no use of pulumi_aws"
    skipped = sorted(m for m in used if follow_imports(m, settings["overrides"]) == "skip")
    assert not skipped, (
        f"mypy does not follow {skipped}, which our code uses: add them to the "
        "follow_imports = 'normal' override in pyproject.toml's [tool.mypy]"
    )


def test_a_use_of_a_skipped_module_is_found() -> None:
    if _source("pulumi_aws") is None:
        pytest.skip("the [infra] extra is not installed")
    code = "import pulumi_aws as aws\naws.rds.Instance('db')\naws.get_region()\n"
    used = referenced_modules(ast.parse(code))
    assert {"pulumi_aws.rds", "pulumi_aws.get_region"} <= used
    overrides = mypy_settings()["overrides"]
    assert follow_imports("pulumi_aws.rds", overrides) == "skip"
    assert follow_imports("pulumi_aws.get_region", overrides) == "skip"
    assert follow_imports("pulumi_aws.ec2.vpc", overrides) == "normal"
    assert follow_imports("pulumi_aws", overrides) == "normal"
