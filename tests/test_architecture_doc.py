"""docs/architecture.md names every runtime module and every import contract, and nothing else.

The page's module tables are the tables of "Package layout and layering" whose header starts with
``module``; each row names one module by its dotted path under ``lensemble`` in backticks:
``federation.admission`` is ``runtime/lensemble/federation/admission.py``, ``network.coordinator``
the sub-package ``runtime/lensemble/network/coordinator/``. Every module (``__init__.py`` and the
generated ``*_pb2*.py`` aside) and every sub-package needs a row, and every row must name one that
exists. The layers table (header starting with ``layer``) puts every top-level package or module
in exactly one row. Anywhere on the page, a full name (``lensemble.render.ranks``, also with an
attribute: ``lensemble.federation.coordinator.Coordinator``) or a path (``lensemble/...py``) must
exist too. Every contract ``id`` of ``[tool.importlinter]`` in ``pyproject.toml`` needs a row in
the contracts table (header starting with ``contract``), and every row there must be a contract.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "runtime" / "lensemble"
DOC = REPO / "docs" / "architecture.md"

#: Names on the page that start like a module but are not Python modules of the package.
NOT_MODULES = {
    "lensemble.v1": "the protobuf package of the gRPC service, e.g. lensemble.v1.Coordinator",
    "lensemble.proto": "the file that defines that service",
    "lensemble.Readiness": "the readiness service of the gRPC health port",
}

CODE_SPAN = re.compile(r"`([^`\n]+)`")
FULL_NAME = re.compile(r"(?<![\w/.-])lensemble(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w/.-])(?:runtime/)?lensemble/[\w/]+\.py\b")
ONE_NAME = re.compile(r"`([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)`")


def runtime_modules(package: Path = PACKAGE) -> set[str]:
    """Every module and sub-package under ``package`` as a dotted path, e.g. ``network.shared``.

    ``__init__.py`` files stand for their (sub-)package; the package itself and generated
    ``*_pb2*.py`` stubs are left out.
    """
    names: set[str] = set()
    for path in package.rglob("*.py"):
        relative = path.relative_to(package)
        if path.name == "__init__.py":
            if relative.parent.parts:
                names.add(".".join(relative.parent.parts))
        elif "_pb2" not in path.stem:
            names.add(".".join(relative.with_suffix("").parts))
    return names


def table_column(text: str, header: str, column: int = 0) -> list[str]:
    """Cell ``column`` of every body row of every Markdown table whose first header is ``header``."""
    cells: list[str] = []
    taking: bool | None = None  # None: not inside a table
    for line in text.splitlines():
        if not line.startswith("|"):
            taking = None
            continue
        row = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if taking is None:
            taking = row[0] == header
        elif taking and not set(line) <= set("|-: "):
            cells.append(row[column] if column < len(row) else "")
    return cells


def module_rows(text: str) -> tuple[list[str], list[str]]:
    """The names of the module tables' rows, and a problem for each row that names no one name."""
    names: list[str] = []
    problems: list[str] = []
    for cell in table_column(text, "module"):
        match = ONE_NAME.fullmatch(cell)
        if match is None:
            problems.append(f"a module row must name one module in backticks, not {cell!r}")
        else:
            names.append(match.group(1))
    return names, problems


def table_problems(text: str, modules: set[str]) -> list[str]:
    """What the module tables and the layers table get wrong about ``modules``."""
    names, problems = module_rows(text)
    problems += [f"`{n}` has two rows in the module tables" for n in sorted(_repeated(names))]
    problems += [f"`{n}` has no row in the module tables" for n in sorted(modules - set(names))]
    problems += [f"`{n}` names no runtime module" for n in sorted(set(names) - modules)]
    layered = [n for cell in table_column(text, "layer", 1) for n in ONE_NAME.findall(cell)]
    top_level = {m for m in modules if "." not in m}
    problems += [f"`{n}` sits in two rows of the layers table" for n in _repeated(layered)]
    problems += [f"`{n}` is in no row of the layers table" for n in sorted(top_level - {*layered})]
    problems += [f"`{n}` in the layers table is no package" for n in sorted({*layered} - top_level)]
    return problems


def _repeated(names: list[str]) -> set[str]:
    return {n for n in names if names.count(n) > 1}


def defined_names(source: Path) -> set[str]:
    """The names a module defines or imports at its top level."""
    names: set[str] = set()
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def unresolved(full_name: str, package: Path = PACKAGE) -> str | None:
    """Why ``full_name`` (``lensemble.a.b`` plus attributes) names nothing, or None when it does.

    The longest prefix that is a module must exist, and the first part after it must be a name
    that module defines at its top level (deeper attributes are not followed).
    """
    parts = full_name.split(".")[1:]
    for length in range(len(parts), -1, -1):
        base = package.joinpath(*parts[:length])
        source = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if source.is_file():
            break
    rest = parts[length:]
    if rest and rest[0] not in defined_names(source):
        module = ".".join(["lensemble", *parts[:length]])
        return f"`{full_name}`: {module} has no module or name {rest[0]!r}"
    return None


def reference_problems(text: str, package: Path = PACKAGE) -> list[str]:
    """Full module names and module paths on the page that name nothing."""
    problems: list[str] = []
    for span in CODE_SPAN.findall(text):
        for name in FULL_NAME.findall(span):
            if _module_like(name) and (why := unresolved(name, package)):
                problems.append(why)
    for path in PATH.findall(text):
        if not (package.parent / path.removeprefix("runtime/")).is_file():
            problems.append(f"`{path}` is no file of the runtime")
    return problems


def _module_like(name: str) -> bool:
    return not any(name == n or name.startswith(n + ".") for n in NOT_MODULES)


def contract_ids(pyproject: Path = REPO / "pyproject.toml") -> set[str]:
    """The ``id`` of every contract in ``[tool.importlinter]``."""
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    return {c["id"] for c in config["tool"]["importlinter"]["contracts"]}


def contract_problems(text: str, ids: set[str]) -> list[str]:
    """Contracts of ``ids`` without a row in the contracts table, and rows that are no contract."""
    rows = [n for cell in table_column(text, "contract") for n in re.findall(r"`([\w-]+)`", cell)]
    problems = [f"contract `{i}` has no row in the contracts table" for i in sorted(ids - {*rows})]
    problems += [f"`{r}` in the contracts table is no contract" for r in sorted({*rows} - ids)]
    return problems


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def test_the_module_tables_name_every_runtime_module_and_no_other() -> None:
    modules = runtime_modules()
    assert {"federation.admission", "network.coordinator", "network.shared.proto"} <= modules
    assert not any("_pb2" in m for m in modules)
    problems = table_problems(_doc(), modules)
    assert not problems, "docs/architecture.md:\n" + "\n".join(problems)


def test_every_full_module_name_and_path_on_the_page_exists() -> None:
    text = _doc()
    assert FULL_NAME.search(text) and PATH.search(text)  # the check has something to check
    problems = reference_problems(text)
    assert not problems, "docs/architecture.md:\n" + "\n".join(problems)


def test_the_contracts_table_has_every_import_linter_contract_and_no_other() -> None:
    ids = contract_ids()
    assert {"training-layers", "network-sides", "no-cycles"} <= ids
    problems = contract_problems(_doc(), ids)
    assert not problems, "docs/architecture.md:\n" + "\n".join(problems)


def test_the_checks_fail_on_a_missing_or_stale_name() -> None:
    text = _doc()
    modules = runtime_modules()
    row = next(line for line in text.splitlines() if line.startswith("| `federation.admission` |"))
    missing = table_problems(text.replace(row + "\n", ""), modules)
    assert "`federation.admission` has no row in the module tables" in missing
    stale = table_problems(text.replace(row, row.replace("admission", "admit")), modules)
    assert "`federation.admit` names no runtime module" in stale
    doubled = table_problems(text.replace("| `ranks` |", "| `ranks`, `ranks` |", 1), modules)
    assert "a module row must name one module in backticks, not '`ranks`, `ranks`'" in doubled
    unlayered = table_problems(
        text.replace("| `federation`, `ranks` |", "| `federation` |"), modules
    )
    assert "`ranks` is in no row of the layers table" in unlayered
    assert reference_problems("`lensemble.federation.coordinator_transport`") == [
        "`lensemble.federation.coordinator_transport`: lensemble.federation has no module or "
        "name 'coordinator_transport'"
    ]
    assert reference_problems("`lensemble.allocator`, `lensemble/network/process.py`") == [
        "`lensemble.allocator`: lensemble has no module or name 'allocator'",
        "`lensemble/network/process.py` is no file of the runtime",
    ]
    assert reference_problems("`lensemble.federation.coordinator.Coordinator.run`") == []
    contract_row = next(line for line in text.splitlines() if line.startswith("| `no-cycles` |"))
    dropped = contract_problems(text.replace(contract_row, ""), contract_ids())
    assert "contract `no-cycles` has no row in the contracts table" in dropped
