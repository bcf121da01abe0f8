"""Issue 41, items 4 and 5: the live bar keeps its count at 80 columns; no terminal, no bar."""

from __future__ import annotations

import io

from rich.console import Console

from lensemble.cli.progress import BarProgress, LineProgress, plural, round_line, round_progress

DETAILS = round_line(
    12, 0, "closed", ["a", "b", "c", "d"], 4, mean_inner_loss=0.6854, bytes_up=194240,
    bytes_down=193792,
)  # fmt: skip


def _bar_at(width: int) -> str:
    screen = io.StringIO()
    console = Console(file=screen, width=width, force_terminal=True, color_system=None)
    bar = BarProgress(20, console)
    bar.closed(13, DETAILS)
    console.print(bar.progress.make_tasks_table(bar.progress.tasks))
    return screen.getvalue()


def test_the_bar_keeps_its_count_and_cuts_the_details_at_80_columns() -> None:
    for width in (60, 80, 120):
        [line] = _bar_at(width).splitlines()
        assert len(line) <= width
        assert "committed 13/20" in line, line
    assert "…" in _bar_at(80)  # the details are cut, with a sign that they are
    assert DETAILS in _bar_at(160)


def test_without_terminals_the_progress_is_plain_lines() -> None:
    stream = io.StringIO()
    progress = round_progress(3, stream)
    assert isinstance(progress, LineProgress)
    with progress:
        progress.opened(0, 0)
        progress.closed(1, round_line(0, 0, "closed", ["a"], 2, bytes_up=10, bytes_down=10))
        progress.closed(1, round_line(1, 1, "aborted", ["a"], 2, quorum=2, excluded={"b": "x"}))
    first, second = stream.getvalue().splitlines()
    assert first.startswith("round 0 committed: 1/2 contributors, up 0.0 kB")
    assert first.endswith(" s since start]") and "[1/3 committed, " in first
    assert second.startswith("round 1 attempt 1 aborted: 1 of 2 required contributors")
    assert "excluded b=x" in second


def test_plural() -> None:
    assert plural(1, "round") == "1 round"
    assert plural(0, "round") == "0 rounds"
    assert plural(2, "process", "processes") == "2 processes"


def test_a_hard_clip_and_a_set_aside_participant_are_named_on_the_round_line() -> None:
    defences = {
        "clipped": {"alpha": 0.73, "delta": 3.58e-07},  # alpha's clip is the median's routine one
        "set_aside": {"bravo": 2.4},
    }
    line = round_line(5, 0, "closed", ["alpha", "bravo", "delta"], 3, defences=defences)
    assert line.endswith("; delta's update clipped by 3.6e-07; set aside from the mean: bravo")
    assert "alpha" not in line.split(";", 1)[1]
    assert round_line(5, 0, "closed", ["a"], 1, defences={"clipped": {"a": 0.5}}) == round_line(
        5, 0, "closed", ["a"], 1
    )
