"""The divergence guard: who can make it roll back, what a rollback commits, replay and verify.

Issue 36: if the committed model gets worse by a margin the honest majority vouches for, the
coordinator rolls back to the best commit (model and outer momentum), says why in the signed
ledger and names the suspects; a resume replays it and ``lensemble verify`` checks it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lensemble.config.schema import DivergenceGuardConfig
from lensemble.federation.checkpoint import CheckpointStore
from lensemble.federation.faults import parse_faults
from lensemble.federation.guard import DivergenceGuard, GuardState, summary
from lensemble.federation.ledger import Ledger, build_line, committed_chain
from lensemble.federation.suspicion import MAX_EVIDENCE, Suspicion, evidence
from lensemble.federation.verify import verify_run
from tests.support.federation import build, small_config

SETTINGS = DivergenceGuardConfig(margin=0.5, patience=2, min_reporters=3)
BEST = {"a": 1.0, "b": 2.0, "c": 4.0, "d": 8.0}


def _guard(**state: object) -> DivergenceGuard:
    return DivergenceGuard(SETTINGS, GuardState(**{"best": 3, "best_reports": BEST, **state}))  # type: ignore[arg-type]


def _times(factors: dict[str, float]) -> dict[str, float | None]:
    return {p: BEST[p] * f for p, f in factors.items()}


def test_the_first_judged_round_becomes_the_best_and_too_few_reports_judge_nothing() -> None:
    guard = DivergenceGuard(SETTINGS)
    assert guard.judge(0, "h0", {"a": 1.0, "b": None, "c": 2.0}).action == "unjudged"
    first = guard.judge(0, "h0", {"a": 1.0, "b": 2.0, "c": 2.0})
    assert first.action == "first" and first.state.best == 0 and first.state.best_hash == "h0"
    guard.apply(first)
    assert guard.judge(1, "h1", {"a": 9.0, "b": 9.0, "x": 1.0}).action == "unjudged"


def test_one_liar_can_neither_trigger_nor_hide_a_rollback() -> None:
    guard = _guard()
    # Three honest participants see a steady model; the liar reports a hundredfold loss.
    lie = guard.judge(4, "h4", _times({"a": 1.0, "b": 1.01, "c": 0.99, "d": 100.0}))
    assert lie.action == "steady" and lie.state.streak == 0
    # Three honest participants see it twice as bad; the liar reports an improvement.
    degraded = guard.judge(4, "h4", _times({"a": 2.0, "b": 2.1, "c": 1.9, "d": 0.1}))
    assert degraded.action == "degraded" and degraded.state.streak == 1


def test_patience_hysteresis_and_the_rollback_verdict() -> None:
    guard = _guard()
    guard.apply(guard.judge(4, "h4", _times({"a": 2.0, "b": 2.0, "c": 2.0, "d": 1.0})))
    # Still above 1 + margin / 2 for the majority: the streak goes on, and reaches patience.
    verdict = guard.judge(5, "h5", _times({"a": 1.3, "b": 1.3, "c": 1.3, "d": 1.0}), ["d"])
    assert verdict.rollback and verdict.suspects == ("d",)
    assert verdict.state.streak == 0 and verdict.state.rollbacks == 1 and verdict.state.best == 3
    assert "v5" in verdict.why and "v3" in verdict.why
    record = verdict.to_record(SETTINGS, guard.state)
    assert record["rollback_to"] == 3 and record["suspects"] == ["d"]
    # Below the hysteresis line the streak ends without a rollback.
    calm = guard.judge(5, "h5", _times({"a": 1.2, "b": 1.2, "c": 1.2, "d": 1.0}))
    assert calm.action == "steady" and calm.state.streak == 0


def test_a_better_model_becomes_the_best_a_steady_one_does_not() -> None:
    guard = _guard()
    better = guard.judge(6, "h6", _times({"a": 0.9, "b": 0.95, "c": 1.2, "d": 0.8}))
    assert better.action == "improved" and better.state.best == 6
    assert better.state.best_reports == _times({"a": 0.9, "b": 0.95, "c": 1.2, "d": 0.8})
    same = guard.judge(6, "h6", _times({"a": 1.0, "b": 1.0, "c": 1.2, "d": 0.8}))
    assert same.action == "steady" and same.state.best == 3


def test_suspicion_grows_with_excess_norm_and_negative_cosine() -> None:
    assert evidence(1.0, 1.0, 0.5) == 0.0
    assert evidence(9.5, 1.0, -0.3) == pytest.approx(2.5513, rel=1e-3)
    # A norm the ledger could not record counts as the most one round may give.
    assert evidence(None, 1.0, None) == MAX_EVIDENCE
    assert evidence(None, 1.0, None, cap=None) > 60  # the uncapped rule of older ledgers
    scores = Suspicion()
    for _ in range(3):
        scores.apply(scores.updated({"a": 1.0, "b": 1.1, "c": 0.9, "d": 9.5}, {"d": -0.3}))
    assert scores.suspects() == ["d"]
    assert max(v for p, v in scores.scores.items() if p != "d") < 0.2


# A toy federation whose fourth participant flips and scales its update from round 2 on, with
# the norm bound of before issue 36 (10 x the median): the model diverges and the guard acts.
ATTACK = "scaled:delta@2-=-20"
WEAK = {"median_factor": 10, "max_relative_change": 1e6}


def _run(out: Path | None, rounds: int = 8) -> list[object]:
    config = small_config(rounds=rounds, robustness=WEAK)
    coordinator, transport, _ = build(config, faults=parse_faults(ATTACK), output_dir=out)
    return coordinator.run(transport).records  # type: ignore[return-value]


def test_a_rollback_commits_the_best_model_and_momentum_again_and_verifies(
    tmp_path: Path,
) -> None:
    config = small_config(rounds=8, robustness=WEAK)
    coordinator, transport, _ = build(config, faults=parse_faults(ATTACK), output_dir=tmp_path)
    record = coordinator.run_round(transport)
    while record.guard.get("action") != "rollback":
        assert coordinator.version < 8, [r.guard.get("action") for r in coordinator.records]
        record = coordinator.run_round(transport)
    target = record.guard["rollback_to"]
    store = CheckpointStore(tmp_path)
    best, rolled = store.load(target), store.load(record.round + 1)
    assert best is not None and rolled is not None
    for name in best.params:
        assert torch.equal(best.params[name], rolled.params[name])
        assert torch.equal(best.momentum[name], rolled.momentum[name])
    assert rolled.model_hash == record.model_hash != best.model_hash  # a new version
    assert record.guard["suspects"] == ["delta"]
    coordinator.run(transport)
    report = verify_run(tmp_path)
    assert report.first_break is None, report.first_break
    said = summary(coordinator.records)
    assert said["warning"] and said["suspects"] == ["delta"]


def test_the_best_model_s_checkpoint_is_kept_whatever_its_age(tmp_path: Path) -> None:
    records = _run(tmp_path, rounds=10)
    best = records[-1].guard["best"]  # type: ignore[attr-defined]
    kept = CheckpointStore(tmp_path).versions()
    assert best in kept and len(kept) <= 4 and kept[-1] == 10


def test_an_in_memory_coordinator_rolls_back_the_same_way(tmp_path: Path) -> None:
    on_disk = [r.model_hash for r in _run(tmp_path)]  # type: ignore[attr-defined]
    in_memory = [r.model_hash for r in _run(None)]  # type: ignore[attr-defined]
    assert in_memory == on_disk


def test_a_resume_after_a_rollback_replays_the_guard(tmp_path: Path) -> None:
    config = small_config(rounds=8, robustness=WEAK)
    straight = [r.model_hash for r in _run(tmp_path / "straight")]  # type: ignore[attr-defined]
    out = tmp_path / "resumed"
    coordinator, transport, _ = build(config, faults=parse_faults(ATTACK), output_dir=out)
    for _ in range(6):
        coordinator.run_round(transport)
    assert any(r.guard.get("action") == "rollback" for r in coordinator.records)
    resumed, transport, _ = build(config, faults=parse_faults(ATTACK), output_dir=out, resume=True)
    assert resumed.defences.guard is not None
    assert resumed.defences.guard.state == coordinator.defences.guard.state  # type: ignore[union-attr]
    resumed.run(transport)
    assert committed_chain(Ledger(out / "ledger.jsonl").records()) == straight


def test_verify_refuses_a_guard_verdict_its_reports_do_not_give(tmp_path: Path) -> None:
    _run(tmp_path)
    ledger = tmp_path / "ledger.jsonl"
    lines = [json.loads(x) for x in ledger.read_text().splitlines()]
    # Forge a consistent chain of lines (no key: anyone could) in which round 1 is "improved"
    # although its reports say otherwise, or a rollback names another target.
    for forge in ("verdict", "target"):
        forged, prev = [], ""
        for body in lines:
            record = dict(body["record"])
            if forge == "verdict" and record["round"] == 1:
                record["guard"] = {**record["guard"], "streak": 7}
            if forge == "target" and record["guard"].get("action") == "rollback":
                record["guard"] = {**record["guard"], "rollback_hash": "sha256:" + "0" * 64}
            text = build_line(body["seq"], prev, record, body["checkpoint"], None)
            prev = json.loads(text)["line_hash"]
            forged.append(text)
        ledger.write_text("\n".join(forged) + "\n")
        brk = verify_run(tmp_path).first_break
        assert brk is not None and "divergence-guard verdict" in brk.sentence()
        assert ("streak" if forge == "verdict" else "rollback_hash") in brk.sentence()


def test_an_honest_toy_run_with_the_guard_off_never_judges() -> None:
    config = small_config(rounds=3, robustness={"guard": {"enabled": False}})
    coordinator, transport, _ = build(config)
    assert all(r.guard == {} for r in coordinator.run(transport).records)
