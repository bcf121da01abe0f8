"""How the CLI talks to people: errors on stderr, one clear line each."""

from __future__ import annotations

import sys

from lensemble.errors import ConfigError, LensembleError


def report_error(exc: LensembleError) -> None:
    """Print an error to stderr: one line per config problem, else message plus the fix."""
    if isinstance(exc, ConfigError):
        for problem in exc.problems:
            sys.stderr.write(f"error: {problem.render()}\n")
        if exc.remediation:
            sys.stderr.write(f"fix: {exc.remediation}\n")
        return
    sys.stderr.write(f"error: {exc.message}\n")
    if exc.remediation:
        sys.stderr.write(f"fix: {exc.remediation}\n")
