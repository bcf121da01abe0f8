"""Fault plans as ``--faults`` strings, and the part of a plan a participant process applies."""

from __future__ import annotations

import pytest

from lensemble.errors import UsageError
from lensemble.federation.faults import parse_faults, participant_faults

IDS = ["alpha", "bravo"]
SPEC = (
    "drop:alpha@3,drop:alpha@3.1,delay:bravo@5,delay:bravo@5=12.5,delay:bravo@1=0.00001,"
    "reorder@2,duplicate:alpha@4,corrupt:alpha@4,poison:bravo@4=1e4,poison:bravo@1=nan,"
    "rank_kill:alpha@2,rank_kill:bravo@3.2=3"
)


def test_a_plan_reads_back_from_its_spec() -> None:
    plan = parse_faults(SPEC, IDS)
    again = parse_faults(plan.spec(), IDS)
    assert [f.spec() for f in again.faults] == [f.spec() for f in plan.faults]
    for ours, theirs in zip(plan.faults, again.faults, strict=True):
        assert ours.kind == theirs.kind and ours.round_index == theirs.round_index
        assert (ours.participant, ours.attempt, ours.seconds) == (
            theirs.participant,
            theirs.attempt,
            theirs.seconds,
        )
    assert plan.faults[-1].spec() == "rank_kill:bravo@3.2=3"
    assert parse_faults("").spec() == ""


def test_a_participant_takes_only_its_own_rank_kills() -> None:
    plan = participant_faults("rank_kill:alpha@2,rank_kill:bravo@3=2", IDS, "bravo")
    assert plan.spec() == "rank_kill:bravo@3=2"
    assert participant_faults("", IDS, "bravo").faults == ()


@pytest.mark.parametrize("spec", ["drop:alpha@1", "reorder@2", "rank_kill:alpha@1,delay:bravo@1"])
def test_a_participant_refuses_the_in_process_transports_faults(spec: str) -> None:
    with pytest.raises(UsageError, match="is injected by the in-process transport only"):
        participant_faults(spec, IDS, "alpha")
