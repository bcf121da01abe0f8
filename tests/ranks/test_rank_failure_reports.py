"""A dead rank is reported once, by Lensemble: torch's own traceback of it is held back."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException

from lensemble.cli.simulate_cmd import rank_failure_notes
from lensemble.ranks.launch import ELASTIC_LOGGER, SPAWN_LOGGER, RankDeaths


def _record(
    logger: str, level: int, msg: str, exc: BaseException | None = None
) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord(logger, level, __file__, 1, msg, (), exc_info)


def test_a_rank_killed_by_a_signal_is_held_back_and_named() -> None:
    deaths = RankDeaths()
    killed = ProcessExitedException("terminated", 1, 3469, -9, "SIGKILL")
    assert not deaths.filter(_record(ELASTIC_LOGGER, logging.ERROR, "failed", killed))
    exited = ProcessExitedException("exited", 0, 3470, 1)
    assert not deaths.filter(_record(ELASTIC_LOGGER, logging.ERROR, "failed", exited))
    stopping = "Terminating process %s via signal SIGTERM"
    assert not deaths.filter(_record(SPAWN_LOGGER, logging.WARNING, stopping))
    assert deaths.deaths == [
        "local rank 1 (pid 3469) killed by SIGKILL",
        "local rank 0 (pid 3470) exited with code 1",
    ]


@pytest.mark.parametrize(
    "record",
    [
        # A rank that raised: its own traceback is the error to read.
        _record(ELASTIC_LOGGER, logging.ERROR, "failed", ProcessRaisedException("boom", 1, 7)),
        _record(SPAWN_LOGGER, logging.WARNING, "Unable to shutdown process %s via SIGTERM"),
        _record(ELASTIC_LOGGER, logging.ERROR, "something else went wrong"),
    ],
)
def test_unexpected_errors_still_show(record: logging.LogRecord) -> None:
    deaths = RankDeaths()
    assert deaths.filter(record) and deaths.deaths == []


class _Seen(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _torch_reports_a_dead_rank() -> None:
    log = logging.getLogger(ELASTIC_LOGGER)
    try:
        raise ProcessExitedException(
            "process 1 terminated with signal SIGKILL", 1, 3469, -9, "SIGKILL"
        )
    except ProcessExitedException:
        log.exception("failed (exitcode: -9) local_rank: 1 (pid: 3469) of fn: rank_main")


def test_launch_round_holds_back_torchs_report_only_while_it_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import torch.distributed.launcher.api as launcher

    from lensemble.config.schema import RankLayout
    from lensemble.ranks.launch import launch_round

    def elastic_launch(config: object, entrypoint: object) -> object:
        def run(*args: object) -> None:  # the agent: a rank died, and something else failed
            _torch_reports_a_dead_rank()
            logging.getLogger(ELASTIC_LOGGER).error("an error nobody expected")

        return run

    monkeypatch.setattr(launcher, "elastic_launch", elastic_launch)
    seen = _Seen()
    logger = logging.getLogger(ELASTIC_LOGGER)
    logger.addHandler(seen)
    try:
        deaths = launch_round(RankLayout(processes_per_node=2), tmp_path, "lensemble-a-0", 5.0)
        assert deaths == ["local rank 1 (pid 3469) killed by SIGKILL"]
        assert seen.messages == ["an error nobody expected"]
        _torch_reports_a_dead_rank()  # after the launch, torch's loggers are as they were
        assert len(seen.messages) == 2
    finally:
        logger.removeHandler(seen)


def test_simulate_says_who_lost_which_round_to_a_dead_rank() -> None:
    excluded = {"coastal": "timeout", "alpine": "rank_failure"}
    assert rank_failure_notes(2, 0, "closed", excluded, rounds=4) == [
        "round 2: a rank of participant alpine failed; alpine is excluded with reason "
        "rank_failure and rejoins in round 3"
    ]
    assert rank_failure_notes(3, 0, "closed", excluded, rounds=4) == [
        "round 3: a rank of participant alpine failed; alpine is excluded with reason "
        "rank_failure"  # the last round: nothing to rejoin
    ]
    assert rank_failure_notes(1, 1, "aborted", excluded, rounds=4) == [
        "round 1 attempt 1: a rank of participant alpine failed; alpine is excluded with reason "
        "rank_failure and rejoins in the next attempt"
    ]
    assert rank_failure_notes(1, 0, "closed", {"coastal": "timeout"}, rounds=4) == []
