"""One round's suspicion evidence is capped: one absurd update costs its sender a few rounds.

The pull along the momentum grows linearly with an update's norm, so before the cap one poison
of 1e4s scored 7e4-1.6e5 and kept its sender set aside for the rest of a 20-round run (seeds 7
and 11 of ``config/local.yaml``, docs/security.md). Capped at ``MAX_EVIDENCE`` the score falls
below the set-aside's release score within four rounds of the last bad update, while a
participant that keeps attacking stays named. Ledgers written before the cap still verify.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lensemble.federation import suspicion
from lensemble.federation.faults import parse_faults
from lensemble.federation.suspicion import DECAY, MAX_EVIDENCE, SUSPECT_SCORE, Suspicion
from lensemble.federation.verify import verify_run
from tests.support.federation import build, small_config

HONEST = {"a": 1.0, "b": 1.1, "c": 0.9}


def _rounds_named(norm_of_d: list[float], *, capped: bool) -> list[bool]:
    """Whether ``d`` is a suspect after each round with these norms of its update."""
    scores = Suspicion(capped=capped)
    named = []
    for norm in norm_of_d:
        cosines = {"a": 0.3, "b": 0.3, "c": 0.3, "d": 0.3}
        scores.apply(scores.updated({**HONEST, "d": norm}, cosines))
        named.append("d" in scores.suspects())
    return named


def test_one_absurd_update_names_its_sender_for_a_few_rounds_not_for_good() -> None:
    history = [1.0, 1e7] + [1.0] * 10  # one update ten million times the median, then honest
    capped = _rounds_named(history, capped=True)
    uncapped = _rounds_named(history, capped=False)
    assert capped[1] and uncapped[1]  # named at once either way
    assert sum(capped) <= 3 and not any(capped[4:])
    assert all(uncapped[1:])  # before the cap: named to the end of the run


def test_a_participant_that_keeps_attacking_stays_named_under_the_cap() -> None:
    named = _rounds_named([1.0] + [1e7] * 10, capped=True)
    assert all(named[1:])
    # The steady score of a capped attacker is the cap itself, far above the threshold.
    assert MAX_EVIDENCE * DECAY >= SUSPECT_SCORE


def test_a_ledger_scored_without_the_cap_still_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The coordinator of before the cap: one poisoned round scores far beyond it.
    with monkeypatch.context() as before:
        before.setattr(suspicion, "MAX_EVIDENCE", float("inf"))
        config = small_config(rounds=6, robustness={})
        coordinator, transport, _ = build(
            config, faults=parse_faults("poison:delta@2=1e4"), output_dir=tmp_path
        )
        records = coordinator.run(transport).records
    scores = [r.defences.get("suspicion", {}).get("delta", 0.0) for r in records]
    assert max(scores) > MAX_EVIDENCE  # the current rule would have scored this line lower
    assert verify_run(tmp_path).first_break is None
