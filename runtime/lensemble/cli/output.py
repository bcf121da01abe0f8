"""How the CLI talks to people: its product on stdout or in a file, status and errors on stderr.

A command that writes a file takes ``-o FILE``. ``-o -`` means stdout, as in every Unix tool,
and a path that is not a regular file or folder (``/dev/stdout``, a named pipe) is written as
a stream: the command's one text goes there and nothing is created beside it. Status lines
(``wrote ...``, notes) always go to stderr, so a pipe carries only the product.
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

from lensemble.errors import ConfigError, LensembleError, UsageError

#: The ``-o`` value that means stdout.
STDOUT = "-"


def is_stdout(output: Path | None) -> bool:
    """True when ``output`` means stdout: no ``-o``, or ``-o -``."""
    return output is None or str(output) == STDOUT


def is_stream(output: Path | None) -> bool:
    """True when ``output`` exists and is neither a regular file nor a folder.

    ``/dev/stdout``, ``/dev/fd/N``, a named pipe or a terminal: the text is written into it,
    and no file is created in its folder (which would be ``/dev``).
    """
    if output is None:
        return False
    try:
        mode = output.stat().st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def write_output(path: Path, text: str) -> None:
    """Write a command's ``-o`` output, creating its folder (UTF-8); a stream is written as is."""
    if not is_stream(path):
        path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        handle.write(text)


def emit(text: str, output: Path | None, *, announce: bool = False) -> None:
    """A command's text: on stdout (no ``-o``, or ``-o -``), or written to ``output``.

    Args:
        text: What the command produced.
        output: The file to write, or None / ``-`` for stdout.
        announce: Also say on stderr which file was written (never for stdout or a stream).
    """
    if is_stdout(output):
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    assert output is not None
    stream = is_stream(output)
    write_output(output, text)
    if announce and not stream:
        status(f"wrote {output}")


def status(line: str) -> None:
    """One status line for people, on stderr (never mixed into a command's product)."""
    sys.stderr.write(line + "\n")


def require_folder(path: Path | None, flag: str) -> None:
    """Refuse ``-`` (stdout) or a stream where a command needs a folder to write into.

    Raises:
        UsageError: ``path`` is ``-`` or an existing non-folder such as ``/dev/stdout``.
    """
    if path is None:
        return
    if str(path) == STDOUT or is_stream(path):
        raise UsageError(
            f"{flag} {path} names a stream, but this command writes several files into a folder;",
            remediation=f"pass a folder to {flag}.",
        )


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
