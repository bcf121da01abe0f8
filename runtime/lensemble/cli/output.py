"""How the CLI talks to people: errors on stderr, one clear line each."""

from __future__ import annotations

import sys
from pathlib import Path

from lensemble.errors import ConfigError, LensembleError


def write_output(path: Path, text: str) -> None:
    """Write a command's ``-o`` output, creating its folder (UTF-8)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def emit(text: str, output: Path | None, *, announce: bool = False) -> None:
    """A command's text: on stdout, or written to ``output`` (``-o``).

    Args:
        text: What the command produced.
        output: The file to write, or None for stdout.
        announce: Also say on stderr which file was written.
    """
    if output is None:
        sys.stdout.write(text)
        return
    write_output(output, text)
    if announce:
        sys.stderr.write(f"wrote {output}\n")


def report_error(exc: LensembleError) -> None:
    """Print an error to stderr: one line per config problem, else one line with the fix."""
    if isinstance(exc, ConfigError):
        for problem in exc.problems:
            sys.stderr.write(f"error: {problem.render()}\n")
        if exc.remediation:
            sys.stderr.write(f"fix: {exc.remediation}\n")
        if not exc.rules_checked:
            sys.stderr.write(
                "note: the rules between fields (quorum, timeouts, environment) are checked "
                "once every field is valid.\n"
            )
        return
    # One line: the message ends where the fix continues the sentence (LensembleError.__str__).
    sys.stderr.write(f"error: {exc}\n")
