"""The coordinator's round events in causal order around a commit written behind (issue 41)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from lensemble.network.coordinator.round_log import RoundLog


def _record(round_index: int, state: str = "closed") -> Any:
    return SimpleNamespace(round=round_index, state=state)


def test_later_events_wait_for_the_commit_then_follow_in_order() -> None:
    log, lines = RoundLog(), []
    log.logs_commits()
    log.closed(_record(0))  # round 0 decided; its line is being written
    log.emit(lambda: lines.append("open 1"))
    log.emit(lambda: lines.append("verdict 1"))
    assert lines == []
    log.committed(lambda: lines.append("committed 0"))
    assert lines == ["committed 0", "open 1", "verdict 1"]
    log.emit(lambda: lines.append("verdict 1 again"))  # nothing pending: at once
    assert lines[-1] == "verdict 1 again"


def test_an_abort_holds_nothing_and_a_failed_commit_releases_what_it_held() -> None:
    log, lines = RoundLog(), []
    log.logs_commits()
    log.closed(_record(3, "aborted"))
    log.emit(lambda: lines.append("open 3.1"))
    assert lines == ["open 3.1"]
    log.closed(_record(3))
    log.emit(lambda: lines.append("open 4"))
    log.release()  # the commit failed: nothing is lost
    assert lines == ["open 3.1", "open 4"]


def test_without_a_commit_logger_nothing_is_held() -> None:
    log, lines = RoundLog(), []
    log.closed(_record(0))
    log.emit(lambda: lines.append("open 1"))
    assert lines == ["open 1"]
