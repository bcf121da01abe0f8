"""The ``rank_kill`` fault: its syntax, and its target checked against the rank layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from lensemble.config import load_config
from lensemble.errors import UsageError
from lensemble.federation.faults import parse_faults
from lensemble.simulation.in_process import check_rank_faults


def test_rank_kill_defaults_to_rank_one_and_takes_a_rank() -> None:
    plan = parse_faults("rank_kill:alpine@2,rank_kill:coastal@3.1=3")
    first, second = plan.faults
    assert (first.kind, first.participant, first.round_index, first.value) == (
        "rank_kill",
        "alpine",
        2,
        1.0,
    )
    assert (second.attempt, second.value) == (1, 3.0)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("rank_kill@2", "needs a participant"),
        ("rank_kill:alpine@2=0", "rank from 1 up"),
        ("rank_kill:alpine@2=x", "rank from 1 up"),
    ],
)
def test_bad_rank_kill_says_how_to_write_it(spec: str, words: str) -> None:
    with pytest.raises(UsageError, match=words):
        parse_faults(spec, ["alpine"])


def test_rank_kill_needs_the_rank_to_exist(in_repo: Path) -> None:
    two = load_config(
        "config/local.yaml", ["federation.participants[0].ranks.processes_per_node=2"]
    )
    check_rank_faults(two, parse_faults("rank_kill:alpine@1"))
    with pytest.raises(UsageError, match="rank 1 of 'coastal', which has 1 rank"):
        check_rank_faults(two, parse_faults("rank_kill:coastal@1"))
    with pytest.raises(UsageError, match="rank 2 of 'alpine'"):
        check_rank_faults(two, parse_faults("rank_kill:alpine@1=2"))
