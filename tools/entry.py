"""How a checkout tool runs: its Typer app, with Lensemble errors as one line and an exit code."""

from __future__ import annotations

import sys

import typer

from lensemble.cli.output import report_error
from lensemble.errors import LensembleError


def run_tool(app: typer.Typer, prog_name: str, argv: list[str] | None = None) -> None:
    """Run ``app`` as ``prog_name``; a LensembleError prints one line and exits with its code.

    Args:
        app: The tool's command group.
        prog_name: How the tool is invoked, e.g. ``python -m tools.vendor``.
        argv: Arguments after the program name (default: ``sys.argv[1:]``).
    """
    try:
        app(args=argv, prog_name=prog_name)
    except LensembleError as exc:
        report_error(exc)
        sys.exit(exc.exit_code)
