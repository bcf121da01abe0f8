"""Run the ``lensemble`` CLI or a checkout tool (``tools/``) in-process; capture code and output."""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class CliResult:
    """Outcome of one CLI invocation."""

    code: int
    out: str
    err: str


def _capture(program: str, args: tuple[str, ...], main: Callable[[], None]) -> CliResult:
    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = [program, *args]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = argv
    return CliResult(code, out.getvalue(), err.getvalue())


def run_cli(*args: str) -> CliResult:
    """Invoke ``lensemble ARGS`` through the real entry point (error handling included)."""
    from lensemble.cli import main

    return _capture("lensemble", args, main)


def run_tool(tool: str, *args: str) -> CliResult:
    """Invoke the checkout tool ``python -m tools.TOOL ARGS`` through its entry point."""
    import importlib

    main = importlib.import_module(f"tools.{tool}.cli").main
    return _capture(f"python -m tools.{tool}", args, main)
