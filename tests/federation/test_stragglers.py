"""The straggler cutoff: once quorum is in, an attempt waits for the rest only so long."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from lensemble.federation.faults import parse_faults
from lensemble.federation.inprocess import ARRIVAL_STEP_S, BASE_ARRIVAL_S
from lensemble.federation.ledger import Ledger, RoundRecord, committed_chain
from lensemble.federation.stragglers import (
    COLLECT_KEY,
    STRAGGLER,
    recent_collect_s,
    straggler_cutoff,
)
from tests.support.federation import build, small_config

#: The virtual collection time of a fault-free round: the last of 4 arrivals.
COLLECT_S = BASE_ARRIVAL_S + 3 * ARRIVAL_STEP_S


@functools.cache
def _one_round() -> RoundRecord:
    coordinator, transport, _ = build(small_config(rounds=1))
    (record,) = coordinator.run(transport).records
    return record


def _record(state: str = "closed", **extra: Any) -> RoundRecord:
    return replace(_one_round(), state=state, extra=dict(extra))


def test_the_recent_collection_time_is_the_median_of_the_last_committed_rounds() -> None:
    history = [_record(**{COLLECT_KEY: value}) for value in (9.0, 1.0, 2.0, 3.0, 4.0, 5.0)]
    assert recent_collect_s(history) == 3.0  # the last five: 1..5
    assert recent_collect_s(history, rounds=2) == 4.5
    ignored = [
        _record("aborted", **{COLLECT_KEY: 100.0}),  # not committed
        _record(),  # written before the key existed
        _record(**{COLLECT_KEY: True}),  # not a number
        _record(**{COLLECT_KEY: -1.0}),
    ]
    assert recent_collect_s([*history, *ignored]) == 3.0
    assert recent_collect_s(ignored) is None


def test_the_cutoff_is_a_multiple_of_recent_rounds_but_never_below_the_minimum() -> None:
    fed = small_config(straggler_factor=3.0, straggler_min_s=2.0).federation
    history = [_record(**{COLLECT_KEY: 1.5})]
    assert straggler_cutoff(fed, 100.0, history) == pytest.approx(104.5)
    assert straggler_cutoff(fed, 100.0, [_record(**{COLLECT_KEY: 0.1})]) == 102.0
    assert straggler_cutoff(fed, 100.0, []) is None  # nothing recent to go by
    off = small_config(straggler_factor=None).federation
    assert straggler_cutoff(off, 100.0, history) is None


def test_a_late_update_after_the_cutoff_is_left_out_as_a_straggler() -> None:
    config = small_config(rounds=3, straggler_factor=3.0, straggler_min_s=5.0)
    coordinator, transport, _ = build(config, faults=parse_faults("delay:bravo@1=8"))
    records = coordinator.run(transport).records
    assert records[1].excluded == {"bravo": STRAGGLER}
    assert records[1].contributors == ["alpha", "charlie", "delta"]
    # Round 1 waited until its cutoff: round 0 collected in COLLECT_S, so the 5 s minimum.
    assert records[0].extra[COLLECT_KEY] == pytest.approx(COLLECT_S)
    assert records[1].extra[COLLECT_KEY] < 5.0
    assert records[2].contributors == ["alpha", "bravo", "charlie", "delta"]
    # Without a cutoff, the same update is in time (the deadline is 30 s).
    late = small_config(rounds=3, straggler_factor=None)
    coordinator, transport, _ = build(late, faults=parse_faults("delay:bravo@1=8"))
    assert coordinator.run(transport).records[1].excluded == {}


def test_below_quorum_an_attempt_waits_past_its_cutoff_until_quorum_is_in() -> None:
    config = small_config(rounds=2, straggler_min_s=1.5)
    faults = parse_faults("delay:alpha@1.0=20,delay:bravo@1.0=25")
    coordinator, transport, _ = build(config, faults=faults)
    records = coordinator.run(transport).records
    # Two of the quorum of 3 were in at the cutoff: the attempt waited on, and closed as soon as
    # alpha made the quorum (20 s), the cutoff having passed; bravo is the straggler.
    assert records[1].state == "closed"
    assert records[1].contributors == ["alpha", "charlie", "delta"]
    assert records[1].excluded == {"bravo": STRAGGLER}
    assert records[1].extra[COLLECT_KEY] == pytest.approx(20.0)


def test_a_resumed_run_cuts_the_same_stragglers(tmp_path: Path) -> None:
    # The recent collection time comes from the ledger, so a resume sees what the run saw.
    config = small_config(rounds=4, straggler_min_s=5.0)
    faults = parse_faults("delay:charlie@3=7")
    straight, transport, _ = build(config, faults=faults, output_dir=tmp_path / "straight")
    straight.run(transport)
    out = tmp_path / "resumed"
    first, transport, _ = build(config, faults=faults, output_dir=out)
    first.run_round(transport)
    first.run_round(transport)
    resumed, transport2, _ = build(config, faults=faults, output_dir=out, resume=True)
    resumed.run(transport2)
    records = Ledger(out / "ledger.jsonl").records()
    assert records[3].excluded == {"charlie": STRAGGLER}
    expected = Ledger(tmp_path / "straight" / "ledger.jsonl").records()
    assert committed_chain(records) == committed_chain(expected)
