"""A participant whose rank group exhausts its restarts leaves; the in-process run goes on.

Over the network such a participant's process says ``Leave`` and exits, and the coordinator
finishes the run with the others (tests/network/test_abstain_processes.py compares the two
ledgers). In process the transport records it ``left`` from that attempt on.
"""

from __future__ import annotations

import pytest

from lensemble.config import LensembleConfig
from lensemble.errors import QuorumNotReached
from lensemble.federation.faults import parse_faults
from lensemble.federation.messages import LEFT, RANK_FAILURE
from tests.support.federation import RankFailingLearner, build, small_config


def _config(quorum: int) -> LensembleConfig:
    return small_config(rounds=4, quorum=quorum, max_round_retries=0)


def test_the_participant_is_left_out_of_every_later_round() -> None:
    config = _config(quorum=3)
    plan = parse_faults("rank_kill:alpha@0,rank_kill:alpha@1", config.participant_ids)
    coordinator, transport, participants = build(config, faults=plan, learner=RankFailingLearner)
    records = coordinator.run(transport).records
    assert [r.state for r in records] == ["closed"] * 4
    assert [r.excluded.get("alpha") for r in records] == [RANK_FAILURE, LEFT, LEFT, LEFT]
    assert all(r.contributors == ["bravo", "charlie", "delta"] for r in records)
    # Trained twice (both rounds lost), never asked again once it left.
    assert participants["alpha"].learner.failed_rounds == [0, 1]  # type: ignore[attr-defined]
    assert transport.sent_by["alpha"] == 0
    assert "max_restarts=1" in transport.left["alpha"].message


def test_below_quorum_without_it_the_run_stops_as_for_any_absence() -> None:
    config = _config(quorum=4)
    plan = parse_faults("rank_kill:alpha@0", config.participant_ids)
    coordinator, transport, _ = build(
        config, faults=plan, learner=lambda pid, seed: RankFailingLearner(pid, seed, max_restarts=0)
    )
    with pytest.raises(QuorumNotReached):
        coordinator.run(transport)
    assert set(transport.left) == {"alpha"}
