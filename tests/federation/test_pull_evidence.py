"""Suspicion from the pull along the outer momentum: min-max and min-sum are named (issue 36).

The estimating min-max and min-sum attacks send the last aggregate plus a perturbation, larger
than the round's median: their component along the outer momentum is 0.5 to 2 median norms
above the round's median component, round after round, where an honest update's stayed within
0.34 of it in every clean run measured, 0.37 under attack (docs/security.md). The excess beyond
``PULL_SLACK`` counts ``PULL_WEIGHT`` times in the evidence; the term is a function of the norms
and cosines the ledger records, so ``lensemble verify`` replays it and refuses a line whose
cosines do not give its scores.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from lensemble.federation.faults import parse_faults
from lensemble.federation.ledger import RoundRecord, build_line
from lensemble.federation.suspicion import (
    PULL_SLACK,
    PULL_WEIGHT,
    SUSPECT_SCORE,
    Suspicion,
    evidence,
    pull,
)
from lensemble.federation.verify import verify_run
from tests.support.federation import build, small_config


def test_pull_is_the_component_along_the_momentum_in_median_norms() -> None:
    assert pull(2.0, 1.0, 0.7) == pytest.approx(1.4)
    assert pull(0.5, 2.0, -0.4) == pytest.approx(-0.1)
    assert pull(None, 1.0, 0.7) == 0.0  # a norm the ledger could not record
    assert pull(1.0, 0.0, 0.7) == 0.0
    assert pull(1.0, 1.0, None) == 0.0  # no momentum yet


def test_only_the_pull_beyond_the_slack_above_the_median_counts() -> None:
    # An update twice the median norm with cosine 0.7, the round's median pull 0.2.
    excess = 2.0 * 0.7 - 0.2 - PULL_SLACK
    assert excess > 0
    assert evidence(2.0, 1.0, 0.7, 0.2) == pytest.approx(math.log(2.0) + PULL_WEIGHT * excess)
    # Within the slack: no pull evidence; without a median pull, no pull term at all.
    assert evidence(1.0, 1.0, 0.2 + PULL_SLACK, 0.2) == 0.0
    assert evidence(2.0, 1.0, 0.7) == pytest.approx(math.log(2.0))


def test_when_everyone_points_along_a_young_momentum_nobody_gains_evidence() -> None:
    # Rounds 1 and 2 of a clean run: every honest update has cosine about 0.75.
    norms = {"a": 1.0, "b": 1.0, "c": 0.95, "d": 1.05}
    cosines = {"a": 0.75, "b": 0.7, "c": 0.78, "d": 0.72}
    scores = Suspicion().updated(norms, cosines)
    median = statistics.median(sorted(norms.values()))
    for pid, score in scores.items():
        # A first round: the score is the evidence itself, here the excess log norm alone.
        assert score == pytest.approx(max(0.0, math.log(norms[pid] / median)), abs=1e-6)


def test_a_persistent_pull_along_the_momentum_is_named_and_honest_outliers_are_not() -> None:
    # The min-sum attacker of the measured runs (N = 4, seed 7): 1.6-2.1 x the median norm,
    # cosine 0.6-0.7; an honest site persistently 1.4 x the median (ordinary cosine), one at
    # 0.5 x with the largest honest cosine, 0.55.
    suspicion = Suspicion()
    named_in = None
    for round_index in range(6):
        norms = {"alpine": 2.0, "coastal": 0.5, "delta": 1.4, "highland": 0.9}
        cosines = {"alpine": 0.65, "coastal": 0.55, "delta": 0.2, "highland": 0.25}
        suspicion.apply(suspicion.updated(norms, cosines))
        if named_in is None and suspicion.suspects():
            named_in = round_index
        assert suspicion.suspects() in ([], ["alpine"])
    assert named_in is not None and named_in <= 1
    assert max(v for p, v in suspicion.scores.items() if p != "alpine") < SUSPECT_SCORE / 2
    # Without the pull term the same history is not named (its norm alone scores about 0.6).
    assert math.log(2.0 / statistics.median([2.0, 0.5, 1.4, 0.9])) < SUSPECT_SCORE


def _pull_decides(record: RoundRecord) -> str | None:
    """A contributor of ``record`` with a positive cosine whose pull term adds evidence."""
    norms: dict[str, float] = record.defences["norms"]  # type: ignore[assignment]
    cosines: dict[str, float | None] = record.defences["cosines"]  # type: ignore[assignment]
    median = statistics.median(sorted(norms.values()))
    pulls = sorted(pull(norms[p], median, cosines[p]) for p in sorted(norms))
    median_pull = statistics.median(pulls)
    for pid in sorted(norms):
        cos = cosines[pid]
        if cos is not None and cos > 0:
            with_pull = evidence(norms[pid], median, cos, median_pull)
            if with_pull > evidence(norms[pid], median, cos):
                return pid
    return None


def test_verify_replays_the_pull_term(tmp_path: Path) -> None:
    config = small_config(rounds=6, robustness={})
    coordinator, transport, _ = build(
        config, faults=parse_faults("minmax:delta@0-"), output_dir=tmp_path
    )
    records = coordinator.run(transport).records
    assert verify_run(tmp_path).first_break is None
    found = [(r.round, _pull_decides(r)) for r in records if r.state == "closed"]
    round_index, pid = next((r, p) for r, p in found if p is not None)
    # Forge a consistent chain (no key: anyone could) whose line records the pull-maker's
    # cosine as 0: the negative-cosine term is unchanged, only the pull term tells.
    ledger = tmp_path / "ledger.jsonl"
    forged, prev = [], ""
    for body in (json.loads(x) for x in ledger.read_text().splitlines()):
        record = dict(body["record"])
        if record["round"] == round_index:
            cosines = {**record["defences"]["cosines"], pid: 0.0}
            record["defences"] = {**record["defences"], "cosines": cosines}
        text = build_line(body["seq"], prev, record, body["checkpoint"], None)
        prev = json.loads(text)["line_hash"]
        forged.append(text)
    ledger.write_text("\n".join(forged) + "\n")
    brk = verify_run(tmp_path).first_break
    assert brk is not None
    assert f"round {round_index}'s suspicion scores" in brk.sentence(), brk.sentence()


def test_a_ledger_written_before_the_pull_term_still_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The coordinator of before 2026-12-05: no pull term in its scores.
    with monkeypatch.context() as before:
        before.setattr("lensemble.federation.suspicion.PULL_WEIGHT", 0.0)
        config = small_config(rounds=6, robustness={})
        coordinator, transport, _ = build(
            config, faults=parse_faults("minmax:delta@0-"), output_dir=tmp_path
        )
        records = coordinator.run(transport).records
    # The current rule would have scored one of its lines differently ...
    assert any(_pull_decides(r) for r in records if r.state == "closed")
    # ... yet the ledger follows the older rule throughout, so it verifies.
    assert verify_run(tmp_path).first_break is None
