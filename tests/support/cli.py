"""Run the ``lensemble`` CLI in-process and capture exit code, stdout and stderr."""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass


@dataclass
class CliResult:
    """Outcome of one CLI invocation."""

    code: int
    out: str
    err: str


def run_cli(*args: str) -> CliResult:
    """Invoke ``lensemble ARGS`` through the real entry point (error handling included)."""
    from lensemble.cli import main

    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["lensemble", *args]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = argv
    return CliResult(code, out.getvalue(), err.getvalue())
