"""How ``lensemble simulate`` shows a run's rounds while they happen, on stderr.

On a terminal (stdout and stderr both), a live bar: the count of committed rounds first, so a
narrow terminal cuts the round's details, never the count. Anywhere else (CI, ``nohup``,
``| tee``, a log file) a live bar would stay silent until the end, so every round gets one plain
line instead, written as it closes.

Rounds are named as the ledger names them: ``round`` is 0-based (round ``t`` commits model
version ``t + 1``); counts say "committed" (``3/20 committed`` after rounds 0, 1 and 2).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from typing import IO, Protocol


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 round``, ``2 rounds``: ``n`` and ``word`` in the number ``n`` asks for.

    ``many`` is the plural where it is not ``word + "s"`` (``processes``).
    """
    return f"{n} {word}" if n == 1 else f"{n} {many or word + 's'}"


def megabytes(n: int) -> str:
    """Bytes as ``0.19 MB`` (from 100 kB up) or ``48.6 kB``."""
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


#: A clipped update is named on the console when the clip scaled it by this much or less (its
#: norm was 100 x the round's bound or more); the ledger has every clip (``defences.clipped``).
NAMED_CLIP = 0.01


def defence_notes(defences: Mapping[str, object] | None) -> str:
    """What the defences did to a round that a console reader should see, or ``""``.

    Updates scaled by :data:`NAMED_CLIP` or less (``defences.clipped``) and participants set
    aside from the mean (``defences.set_aside``); every other decision is in the ledger.
    """
    if not defences:
        return ""
    notes = []
    clipped = defences.get("clipped")
    if isinstance(clipped, Mapping):
        strong = {
            k: v for k, v in clipped.items() if isinstance(v, (int, float)) and v <= NAMED_CLIP
        }
        notes += [f"{k}'s update clipped by {float(v):.2g}" for k, v in sorted(strong.items())]
    aside = defences.get("set_aside")
    if isinstance(aside, Mapping) and aside:
        notes.append("set aside from the mean: " + ", ".join(sorted(str(k) for k in aside)))
    return "; ".join(notes)


def round_line(
    round_index: int,
    attempt: int,
    state: str,
    contributors: Sequence[str],
    participants: int,
    *,
    quorum: int | None = None,
    excluded: dict[str, str] | None = None,
    mean_inner_loss: float | None = None,
    bytes_up: int | None = None,
    bytes_down: int | None = None,
    defences: Mapping[str, object] | None = None,
) -> str:
    """One sentence about a closed or aborted round attempt, numbered as the ledger numbers it.

    Args:
        round_index: The ledger's ``round`` (0-based).
        attempt: The ledger's ``attempt`` (0-based); named only when it is not the first.
        state: ``closed`` (committed) or ``aborted``.
        contributors: Who contributed.
        participants: How many participants the run has.
        quorum: Contributors a commit needs (named for an aborted attempt).
        excluded: Participant id -> why it did not contribute.
        mean_inner_loss: Mean inner loss of the contributors, if known.
        bytes_up: Update bytes received (bytes), if known.
        bytes_down: Model bytes sent (bytes), if known.
        defences: The ledger's ``defences`` of the attempt (:func:`defence_notes`), if known.
    """
    where = f"round {round_index}" + (f" attempt {attempt}" if attempt else "")
    if state == "aborted":
        text = f"{where} aborted: {len(contributors)} of {quorum} required contributors"
    else:
        text = f"{where} committed: {len(contributors)}/{participants} contributors"
    if state != "aborted" and mean_inner_loss is not None:
        text += f", inner loss {mean_inner_loss:.4f}"
    if bytes_up is not None and bytes_down is not None:
        text += f", up {megabytes(bytes_up)}, down {megabytes(bytes_down)}"
    if excluded:
        text += "; excluded " + ", ".join(f"{k}={v}" for k, v in sorted(excluded.items()))
    notes = defence_notes(defences)
    return f"{text}; {notes}" if notes else text


def interactive(*streams: IO[str]) -> bool:
    """True when every stream is a terminal (default: stdout and stderr)."""
    checked = streams or (sys.stdout, sys.stderr)
    return all(callable(getattr(s, "isatty", None)) and s.isatty() for s in checked)


class RoundProgress(Protocol):
    """What the simulate command tells its display."""

    def __enter__(self) -> RoundProgress:
        """Start showing."""

    def __exit__(self, *exc: object) -> None:
        """Stop showing (the bar stays on screen)."""

    def opened(self, round_index: int, attempt: int) -> None:
        """Round ``round_index`` attempt ``attempt`` opened: its participants train."""

    def closed(self, committed: int, line: str) -> None:
        """A round attempt closed or aborted (``line``, from :func:`round_line`).

        ``committed`` counts the run's committed rounds after it.
        """

    def note(self, line: str) -> None:
        """Something a person should read now (a rejection, a failed rank)."""


class LineProgress:
    """One plain line per round on ``stream``, written as the round closes (no terminal).

    Args:
        rounds: ``federation.rounds``.
        stream: Where to write (stderr).
    """

    def __init__(self, rounds: int, stream: IO[str]) -> None:
        self.rounds = rounds
        self.stream = stream
        self._start = time.monotonic()

    def __enter__(self) -> LineProgress:
        """Nothing to start: lines are written as rounds close."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Nothing to stop."""

    def opened(self, round_index: int, attempt: int) -> None:
        """A line per opening would double the output; the closing line says it all."""

    def closed(self, committed: int, line: str) -> None:
        """``line``, then the run's committed count and elapsed time."""
        elapsed = time.monotonic() - self._start
        self._write(f"{line} [{committed}/{self.rounds} committed, {elapsed:.0f} s since start]")

    def note(self, line: str) -> None:
        """``line`` as it is, indented under the round lines."""
        self._write(f"  {line}")

    def _write(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()


class BarProgress:
    """A live bar on a terminal: ``committed M/N``, the bar, elapsed time, the last round.

    The count comes first and the details last, cut with an ellipsis when the terminal is
    narrow (80 columns keep the count and the bar).

    Args:
        rounds: ``federation.rounds``.
        console: The rich console on stderr.
    """

    def __init__(self, rounds: int, console: object) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.table import Column

        assert isinstance(console, Console)
        self.rounds = rounds
        self.console = console
        self.progress = Progress(
            TextColumn("committed"),
            MofNCompleteColumn(),
            BarColumn(bar_width=16),
            TimeElapsedColumn(),
            TextColumn(
                "{task.description}",
                table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis"),
            ),
            console=console,
            expand=True,  # the description column takes what is left, and only that
            transient=False,
        )
        self.task = self.progress.add_task("collecting data...", total=rounds, completed=0)

    def __enter__(self) -> BarProgress:
        """Start the live display."""
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop the live display; the bar stays on screen."""
        self.progress.stop()

    def opened(self, round_index: int, attempt: int) -> None:
        """Show that the round trains."""
        where = f"round {round_index}" + (f" attempt {attempt}" if attempt else "")
        self.progress.update(self.task, description=f"{where}: training...")

    def closed(self, committed: int, line: str) -> None:
        """Count the committed rounds and show how the last attempt went."""
        self.progress.update(self.task, completed=committed, description=line)

    def note(self, line: str) -> None:
        """Print ``line`` above the bar."""
        self.console.print(f"  {line}", markup=False, highlight=False)


def round_progress(rounds: int, stream: IO[str] | None = None) -> RoundProgress:
    """The display for a run of ``rounds`` rounds: a bar on a terminal, plain lines elsewhere.

    Args:
        rounds: ``federation.rounds``.
        stream: Where plain lines go (default stderr); a bar needs stdout and stderr terminals.
    """
    if stream is None and interactive():
        from rich.console import Console

        return BarProgress(rounds, Console(stderr=True))
    return LineProgress(rounds, stream or sys.stderr)
