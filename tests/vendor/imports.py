"""Static import analysis of a package with ``ast``: who imports what, lazily or not."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ImportSite:
    """One import statement (or ``importlib.import_module("...")`` call) in a module."""

    module: str  # the importing module, e.g. lensemble.data.vendored_envs
    target: str  # the imported module, absolute, e.g. stable_worldmodel.envs
    names: tuple[str, ...]  # for ``from X import a, b``: ("a", "b")
    in_function: bool  # inside a def (lazy) rather than at import time
    type_only: bool  # under ``if TYPE_CHECKING:``


def module_name(path: Path, package_root: Path) -> str:
    """Dotted module name of ``path`` inside the package rooted at ``package_root``."""
    rel = path.relative_to(package_root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def parse(path: Path) -> ast.Module:
    """The file's syntax tree.

    CPython 3.11 before 3.11.8 can fail an ``ast.parse`` with "SystemError: AST constructor
    recursion depth mismatch" while another thread of the process builds a tree too (an import
    compiling a module: python/cpython#106905); the tree itself is fine, so one retry gives it.
    """
    source = path.read_text(encoding="utf-8")
    try:
        return ast.parse(source, filename=str(path))
    except SystemError:
        return ast.parse(source, filename=str(path))


def import_sites(path: Path, package_root: Path) -> Iterator[ImportSite]:
    """Every import in one file, with whether it is lazy or type-only."""
    module = module_name(path, package_root)
    is_package = path.name == "__init__.py"
    tree = parse(path)

    def visit(node: ast.AST, in_function: bool, type_only: bool) -> Iterator[ImportSite]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield ImportSite(module, alias.name, (), in_function, type_only)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(node, module, is_package)
            names = tuple(a.name for a in node.names)
            yield ImportSite(module, target, names, in_function, type_only)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (getattr(node.func, "attr", None) or getattr(node.func, "id", None))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield ImportSite(module, node.args[0].value, (), in_function, type_only)
        for child in ast.iter_child_nodes(node):
            child_in_function = in_function or isinstance(
                node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            )
            child_type_only = type_only or (
                isinstance(node, ast.If) and _is_type_checking(node.test) and child in node.body
            )
            yield from visit(child, child_in_function, child_type_only)

    yield from visit(tree, False, False)


def package_modules(package_root: Path) -> dict[str, Path]:
    """Module name to file for every ``.py`` file of the package."""
    return {
        module_name(p, package_root): p
        for p in sorted(package_root.rglob("*.py"))
        if "__pycache__" not in p.parts
    }
