"""Keep the best committed version (``federation.final_model: best_reported``, issue 39).

The scoring (median of the kept contributors' held-out reports, at least a quorum of them), that
one liar cannot move the choice, that the run ends with the best version and its parameters
(in memory and from its pinned checkpoint), that ``lensemble verify`` refuses a forged best,
that a resume makes the same choice, and that the default records nothing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from lensemble.config import config_hash
from lensemble.federation.checkpoint import CheckpointStore
from lensemble.federation.coordinator import RunSummary
from lensemble.federation.faults import parse_faults
from lensemble.federation.final_model import kept_in_record
from lensemble.federation.keep_best import (
    ENTRY,
    BestReported,
    BestState,
    final_choice,
    kept_reports,
    median_score,
)
from lensemble.federation.ledger import Ledger, build_line, committed_chain
from lensemble.federation.verify import verify_run
from tests.support.federation import build, small_config

pytestmark = pytest.mark.unit

#: Rounds of the toy runs: the quadratic federation (outer lr 0.7, Nesterov 0.9) overshoots,
#: so its best reported version is an early one, not the last.
ROUNDS = 6


def _run(out: Path | None, faults: str = "", rounds: int = ROUNDS, **fed: object) -> RunSummary:
    config = small_config(rounds=rounds, final_model="best_reported", **fed)
    plan = parse_faults(faults) if faults else None
    coordinator, transport, _ = build(config, faults=plan, output_dir=out)
    return coordinator.run(transport)


def _scores(summary: RunSummary) -> list[float | None]:
    return [r.defences[ENTRY]["score"] for r in summary.records if r.state == "closed"]


def test_the_score_is_the_median_of_at_least_a_quorum_of_valid_reports() -> None:
    reports = {"a": 3.0, "b": 1.0, "c": 2.0, "d": None}
    assert median_score(reports, 3) == (2.0, 3)
    assert median_score({**reports, "e": 4.0}, 3) == (2.5, 4)
    assert median_score(reports, 4) == (None, 3)  # below quorum: unscored
    invalid = {"a": math.nan, "b": math.inf, "c": -1.0, "d": 0.5}
    assert median_score(invalid, 1) == (0.5, 1)
    assert median_score({}, 1) == (None, 0)


def test_only_kept_contributors_reports_count() -> None:
    reported = {
        "alpha": {"heldout_loss": 1.0},
        "bravo": {"heldout_loss": 2.0},
        "charlie": {"heldout_loss": None},
        "delta": {"heldout_loss": 0.0},
    }
    # delta was set aside; echo is no contributor (its update was rejected).
    kept = kept_reports(
        {**reported, "echo": {"heldout_loss": 0.1}},
        ["alpha", "bravo", "charlie", "delta"],
        {"delta": 9.0},
    )
    assert kept == {"alpha": 1.0, "bravo": 2.0, "charlie": None}


def test_the_lowest_score_is_best_the_earliest_on_ties_and_unscored_versions_change_nothing() -> (
    None
):
    tracker = BestReported(2)
    steps = [
        (0, {"a": 4.0, "b": 4.0}),
        (1, {"a": 2.0, "b": 2.0}),
        (2, {"a": 2.0, "b": 2.0}),  # a tie: v1 stays best
        (3, {"a": 0.1, "b": None}),  # one report, quorum 2: unscored
        (4, {"a": 3.0, "b": 3.0}),
    ]
    for version, reports in steps:
        scoring = tracker.score(version, f"h{version}", reports)
        tracker.apply(scoring)
    assert tracker.state == BestState(1, "h1", 2.0, 4)
    assert scoring.to_record() == {
        "version": 4,
        "score": 3.0,
        "reporters": 2,
        "quorum": 2,
        "best": 1,
        "best_hash": "h1",
        "best_score": 2.0,
        "scored": 4,
    }


@pytest.mark.parametrize("lie", [0.0, 1e6])
def test_one_liar_cannot_move_the_choice(lie: float) -> None:
    honest_a = {f"p{i}": 1.0 + i / 10 for i in range(5)}  # version 0: better for everyone
    honest_b = {f"p{i}": 2.0 + i / 10 for i in range(5)}  # version 1
    for liar_on_a, liar_on_b in ((lie, lie), (1e6, 0.0), (0.0, 1e6)):
        tracker = BestReported(4)
        tracker.apply(tracker.score(0, "ha", {**honest_a, "liar": liar_on_a}))
        tracker.apply(tracker.score(1, "hb", {**honest_b, "liar": liar_on_b}))
        assert tracker.state.version == 0, (liar_on_a, liar_on_b)


def test_the_final_choice_says_which_version_and_why() -> None:
    choice = final_choice(BestState(3, "h3", 0.25, 5), 6, "h6")
    assert (choice.version, choice.round, choice.model_hash, choice.last) == (3, 2, "h3", 6)
    assert "kept v3" in choice.why and "v6" in choice.why and "0.25" in choice.why
    nothing = final_choice(BestState(), 6, "h6")
    assert (nothing.version, nothing.model_hash, nothing.score) == (6, "h6", None)
    assert "no version was scored" in nothing.why


def test_a_run_ends_with_its_best_reported_version_not_its_last(tmp_path: Path) -> None:
    summary = _run(tmp_path)
    scores = _scores(summary)
    assert all(s is not None for s in scores)
    best = min(range(len(scores)), key=lambda v: (scores[v], v))
    assert summary.kept is not None
    choice = summary.kept.choice
    assert (choice.version, choice.last) == (best, ROUNDS)
    assert best < ROUNDS - 1  # an early version, not merely the last one scored
    chain = committed_chain(summary.records)
    assert choice.model_hash == summary.records[best].parent_hash
    assert choice.model_hash in [summary.records[0].parent_hash, *chain]
    # Its parameters are those of its checkpoint, which is kept whatever its age.
    ckpt = CheckpointStore(tmp_path).load(best)
    assert ckpt is not None and ckpt.model_hash == choice.model_hash
    for name, tensor in ckpt.params.items():
        assert torch.equal(summary.kept.params[name], tensor)
    assert verify_run(tmp_path).first_break is None
    # Without a folder the best model is kept in memory: the same choice and parameters.
    in_memory = _run(None)
    assert in_memory.kept is not None and in_memory.kept.choice == choice
    for name, tensor in ckpt.params.items():
        assert torch.equal(in_memory.kept.params[name], tensor)


@pytest.mark.parametrize("factor", [0.0, 1e6])
def test_a_liar_about_its_held_out_loss_cannot_move_the_choice(factor: float) -> None:
    honest = _run(None)
    lying = _run(None, f"misreport:bravo@0-={factor:g}")
    assert honest.kept is not None and lying.kept is not None
    assert lying.kept.choice.version == honest.kept.choice.version


def test_verify_refuses_a_forged_best(tmp_path: Path) -> None:
    _run(tmp_path)
    ledger = tmp_path / "ledger.jsonl"
    lines = [json.loads(x) for x in ledger.read_text().splitlines()]
    # Forge a consistent chain (no key: anyone could) whose last line names another best.
    last = lines[-1]["record"]["round"]
    for name, forged_entry in {
        "best": lambda e: {
            **e,
            "best": ROUNDS - 1,
            "best_hash": lines[-1]["record"]["parent_hash"],
        },
        "score": lambda e: {**e, "score": 0.0},
        "hash": lambda e: {**e, "best_hash": "sha256:" + "0" * 64},
    }.items():
        forged, prev = [], ""
        for body in lines:
            record = dict(body["record"])
            if record["round"] == last:
                entry = forged_entry(record["defences"][ENTRY])
                record["defences"] = {**record["defences"], ENTRY: entry}
            text = build_line(body["seq"], prev, record, body["checkpoint"], None)
            prev = json.loads(text)["line_hash"]
            forged.append(text)
        ledger.write_text("\n".join(forged) + "\n")
        brk = verify_run(tmp_path).first_break
        assert brk is not None, name
        assert f"round {last}'s best reported version" in brk.sentence(), (name, brk.sentence())


def test_a_resume_makes_the_same_choice(tmp_path: Path) -> None:
    straight = _run(tmp_path / "straight")
    config = small_config(rounds=ROUNDS, final_model="best_reported")
    out = tmp_path / "resumed"
    coordinator, transport, _ = build(config, output_dir=out)
    for _ in range(ROUNDS - 2):
        coordinator.run_round(transport)
    resumed, transport, _ = build(config, output_dir=out, resume=True)
    assert resumed.final.tracker.state == coordinator.final.tracker.state
    summary = resumed.run(transport)
    assert straight.kept is not None and summary.kept is not None
    assert summary.kept.choice == straight.kept.choice
    records = [r for r in Ledger(out / "ledger.jsonl").records() if r.state == "closed"]
    assert [r.defences[ENTRY] for r in records] == [
        r.defences[ENTRY] for r in straight.records if r.state == "closed"
    ]
    # A finished run resumed again has nothing to run and makes the same choice.
    again, transport, _ = build(config, output_dir=out, resume=True)
    finished = again.run(transport)
    assert finished.kept is not None and finished.kept.choice == straight.kept.choice


def test_the_default_ends_with_the_last_version_and_records_nothing(tmp_path: Path) -> None:
    config = small_config(rounds=3)
    assert config.federation.final_model == "last"
    coordinator, transport, _ = build(config, output_dir=tmp_path)
    summary = coordinator.run(transport)
    assert summary.kept is None
    assert all(ENTRY not in r.defences for r in summary.records)
    # The option kept the config hash of every run that ends with its last version.
    explicit = small_config(rounds=3, final_model="last")
    assert config_hash(explicit) == config_hash(config)
    assert config_hash(small_config(rounds=3, final_model="best_reported")) != config_hash(config)
    # ... and the models it commits do not depend on it.
    best = _run(None, rounds=3)
    assert committed_chain(best.records) == committed_chain(summary.records)


def test_a_finished_run_s_folder_names_the_same_kept_version(tmp_path: Path) -> None:
    # What `simulate` over the network reads once the coordinator process has ended.
    summary = _run(tmp_path)
    config = small_config(rounds=ROUNDS, final_model="best_reported")
    store = CheckpointStore(tmp_path)
    last = store.load()
    assert last is not None and summary.kept is not None
    committed = [r for r in Ledger(tmp_path / "ledger.jsonl").records() if r.state == "closed"]
    kept = kept_in_record(config.federation, committed, store, last)
    assert kept is not None and kept.choice == summary.kept.choice
    for name, tensor in summary.kept.params.items():
        assert torch.equal(kept.params[name], tensor)
    default = small_config(rounds=ROUNDS)
    assert kept_in_record(default.federation, committed, store, last) is None
