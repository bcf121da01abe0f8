"""``python -m tools.vendor``: materialise and guard the vendored code in ``third_party/``.

A development tool of the source checkout: it is not part of the installed ``lensemble``
package (nor of the runtime image) and runs from the repository root.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from lensemble.cli.output import report_error
from lensemble.errors import LensembleError, UsageError
from tools.entry import run_tool

if TYPE_CHECKING:
    from collections.abc import Callable

    from tools.vendor import Project

app = typer.Typer(
    name="python -m tools.vendor",
    help="Vendored upstream code (third_party/): sync pinned releases plus patches, check drift. "
    "Run from the repository root of a source checkout.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

NameArgument = typer.Argument(
    None, help="Project (e.g. stable_worldmodel or stable-worldmodel); default: every project."
)
RootOption = typer.Option(
    Path("."), "--root", help="Repository root holding third_party/.", metavar="DIR"
)


def _projects(root: Path, name: str | None) -> list[Project]:
    from tools.vendor import find_projects, load_project

    third_party = root / "third_party"
    if name is not None:
        return [load_project(third_party, name)]
    projects = find_projects(third_party)
    if not projects:
        raise UsageError(
            f"{third_party} holds no vendored project (no */vendor.toml).",
            remediation="run from the repository root of a source checkout or pass --root.",
        )
    return projects


def _parse_update(spec: str) -> tuple[str, str]:
    name, sep, version = spec.partition("==")
    if not sep or not name.strip() or not version.strip():
        raise UsageError(
            f"--update '{spec}' is not NAME==VERSION.",
            remediation="write e.g. --update stable-worldmodel==0.1.1.",
        )
    return name.strip(), version.strip()


def _run_each(projects: list[Project], action: str, run: Callable[[Project], str]) -> None:
    """Run ``run(project)`` for each project; report every failure, exit with the first code."""
    codes: list[int] = []
    for project in projects:
        try:
            line = run(project)
        except LensembleError as exc:
            report_error(exc)
            codes.append(exc.exit_code)
            continue
        typer.echo(line)
    if codes:
        if len(projects) > 1:
            sys.stderr.write(f"vendor {action}: {len(codes)} of {len(projects)} projects failed\n")
        raise typer.Exit(codes[0])


@app.command()
def sync(
    name: str | None = NameArgument,
    cache: Path | None = typer.Option(
        None,
        "--cache",
        help="Folder with distribution files to use (and to download into); "
        "default: third_party/.cache.",
        metavar="DIR",
    ),
    update: str | None = typer.Option(
        None,
        "--update",
        help="Move a pin: NAME==VERSION. Reports every patch that no longer applies.",
        metavar="NAME==VERSION",
    ),
    locked: bool = typer.Option(
        False, "--locked", help="Fail if the lock would change instead of rewriting it (CI)."
    ),
    root: Path = RootOption,
) -> None:
    """Materialise pinned releases plus their patches.

    Downloads (or takes from --cache) each pinned release, verifies its SHA-256, unpacks it to
    third_party/NAME/src and applies the patch series; records the tree digest in the lock.
    """
    from tools.vendor import SyncReport, load_project, sync_project

    target: tuple[str, str] | None = _parse_update(update) if update else None
    if target is not None:
        moved = load_project(root / "third_party", target[0])
        if name is not None and load_project(root / "third_party", name).name != moved.name:
            raise UsageError(
                f"--update names {target[0]} but the project argument is {name}.",
                remediation="name the same project in both, or drop the argument.",
            )
        projects = [moved]
    else:
        projects = _projects(root, name)

    def run(project: Project) -> str:
        report: SyncReport = sync_project(
            project,
            cache_dir=cache,
            update=target[1] if target else None,
            locked=locked,
        )
        moved_from = (
            f" (moved from {report.previous_version})"
            if report.previous_version not in (None, report.version)
            else ""
        )
        lock = "lock updated" if report.lock_changed else "lock unchanged"
        lines = [
            f"synced {report.project}: {report.package} {report.version}{moved_from}, "
            f"{report.filename} sha256 {report.sha256[:12]}, {report.patches} patch(es) applied, "
            f"{report.files} files, {report.tree_digest}; {lock}"
        ]
        lines += [f"note: {note}" for note in report.license.notes]
        return "\n".join(lines)

    _run_each(projects, "sync", run)


@app.command()
def check(name: str | None = NameArgument, root: Path = RootOption) -> None:
    """Drift and license guards, offline.

    Fails when third_party/NAME/src differs from pristine upstream plus the patch series, a
    patch lacks a DEP-3 field, or the license file is missing without a recorded exception.
    """
    from tools.vendor import CheckReport, check_project

    def run(project: Project) -> str:
        report: CheckReport = check_project(project)
        license_text = (
            f"license {report.license.spdx} ({report.license.file})"
            if report.license.file
            else f"license {report.license.spdx} (no file; recorded exception)"
        )
        lines = [
            f"clean {report.project}: {report.package} {report.version} + "
            f"{report.patches} patch(es), {report.files} files, {report.tree_digest}, "
            f"{license_text}"
        ]
        lines += [f"note: {note}" for note in report.license.notes]
        return "\n".join(lines)

    _run_each(_projects(root, name), "check", run)


def main(argv: list[str] | None = None) -> None:
    """Run ``python -m tools.vendor`` with ``argv`` (default: ``sys.argv[1:]``)."""
    run_tool(app, "python -m tools.vendor", argv)
