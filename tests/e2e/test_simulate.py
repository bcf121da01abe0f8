"""The main job end to end: ``lensemble simulate`` through the real CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lensemble.federation.ledger import Ledger, committed_chain
from tests.support.cli import run_cli

# A smaller, faster version of config/local.yaml that keeps a clear federation margin.
SMALL = [
    "--set",
    "data.episodes=12",
    "--set",
    "data.episode_steps=60",
    "--set",
    "federation.inner_steps=15",
]

# Runs that test something else train no baseline.
NO_BASELINES = [
    "--set",
    "evaluation.local_only_baseline=false",
    "--set",
    "evaluation.pooled_oracle=false",
    "--set",
    "evaluation.fedavg_ablation=false",
]


def _simulate(out: Path, *args: str) -> dict[str, object]:
    result = run_cli("simulate", "config/local.yaml", "--json", "-o", str(out), *SMALL, *args)
    assert result.code == 0, result.err
    summary: dict[str, object] = json.loads(result.out)
    return summary


def _chain(out: Path) -> list[str]:
    return committed_chain(Ledger(out / "ledger.jsonl").records())


@pytest.mark.slow
def test_federation_beats_training_alone_on_the_union_of_held_out_data(
    in_repo: Path, tmp_path: Path
) -> None:
    summary = _simulate(tmp_path / "run")
    assert summary["rounds_committed"] == 20
    federated = summary["federated_union_k_step_error"]
    alone = summary["local_only_mean_union_k_step_error"]
    assert isinstance(federated, float) and isinstance(alone, float)
    assert federated < 0.9 * alone, (federated, alone)
    # Every baseline is in the summary, each on the union of held-out data.
    assert summary["best_single_site"] in ("alpine", "coastal", "delta", "highland")
    for key in ("pooled_oracle_union_k_step_error", "fedavg_union_k_step_error"):
        assert isinstance(summary[key], float) and summary[key] > 0, key
    out = tmp_path / "run"
    records = Ledger(out / "ledger.jsonl").records()
    assert [r.round for r in records] == list(range(20))
    assert all(r.contributors == ["alpine", "coastal", "delta", "highland"] for r in records)
    assert summary["bytes_up"] == sum(r.bytes_up for r in records)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 20 and metrics[-1]["federated"]["union"]["k_step_error"] == federated
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (out / "coordinator/checkpoints").iterdir())[-1] == (
        "model-v000020.safetensors"
    )
    # Each participant's data stays in its own folder, never in the coordinator's.
    for pid in ("alpine", "coastal", "delta", "highland"):
        assert any((out / "participants" / pid / "data").iterdir())
    assert not list((out / "coordinator").rglob("*trajector*"))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [7, 1])
def test_federation_beats_the_best_site_alone(in_repo: Path, tmp_path: Path, seed: int) -> None:
    # config/local.yaml as it is (its defaults come from bench/federation_payoff.py, which
    # found the federation ahead of every site alone for every seed it ran); only the
    # local-only baselines are trained next to it.
    result = run_cli(
        "simulate",
        "config/local.yaml",
        "--json",
        "-o",
        str(tmp_path / "run"),
        "--set",
        f"run.root_seed={seed}",
        "--set",
        "evaluation.pooled_oracle=false",
        "--set",
        "evaluation.fedavg_ablation=false",
    )
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    federated = summary["federated_union_k_step_error"]
    best = summary["best_single_site_union_k_step_error"]
    assert isinstance(federated, float) and isinstance(best, float)
    assert federated < best, (seed, summary["best_single_site"], federated, best)
    # No late degradation: the final model is within 5% of the best round's.
    assert federated <= 1.05 * summary["federated_best_round_union_k_step_error"]
    assert summary["pooled_oracle_union_k_step_error"] is None


@pytest.mark.slow
def test_same_config_and_seed_give_the_same_hash_chain(in_repo: Path, tmp_path: Path) -> None:
    fast = ["--rounds", "3", *NO_BASELINES]
    a = _simulate(tmp_path / "a", *fast)
    b = _simulate(tmp_path / "b", *fast)
    assert a["model_hash"] == b["model_hash"]
    assert _chain(tmp_path / "a") == _chain(tmp_path / "b")
    c = _simulate(tmp_path / "c", *fast, "--set", "run.root_seed=8")
    assert c["model_hash"] != a["model_hash"]


@pytest.mark.slow
def test_resume_continues_to_the_same_chain(in_repo: Path, tmp_path: Path) -> None:
    fast = NO_BASELINES
    straight = _simulate(tmp_path / "straight", "--rounds", "4", *fast)
    _simulate(tmp_path / "resumed", "--rounds", "2", *fast)
    resumed = _simulate(tmp_path / "resumed", "--rounds", "4", "--resume", *fast)
    assert _chain(tmp_path / "resumed") == _chain(tmp_path / "straight")
    # The summary covers the whole run and says where this process took over.
    assert resumed["hash_chain"] == straight["hash_chain"] == _chain(tmp_path / "straight")
    assert (resumed["rounds_committed"], resumed["resumed_from_version"]) == (4, 2)
    assert straight["resumed_from_version"] is None
    # Resuming with fewer rounds than committed is refused; a fresh run says what it replaces.
    shrink = run_cli(
        "simulate", "-o", str(tmp_path / "resumed"), *SMALL, "--rounds", "3", "--resume"
    )
    assert shrink.code == 2
    assert "already committed 4 rounds" in shrink.err and "--rounds 4 or more" in shrink.err
    again = run_cli(
        "simulate", "--json", "-o", str(tmp_path / "resumed"), *SMALL, "--rounds", "1", *fast
    )
    assert again.code == 0
    assert "replacing the previous run" in again.err and "(4 rounds committed)" in again.err
    assert len(_chain(tmp_path / "resumed")) == 1


def test_faults_exclude_participants_and_are_recorded(in_repo: Path, tmp_path: Path) -> None:
    _simulate(
        tmp_path / "f",
        "--rounds",
        "3",
        *NO_BASELINES,
        "--faults",
        "drop:alpine@1,duplicate:delta@2",
    )
    records = Ledger(tmp_path / "f" / "ledger.jsonl").records()
    # Quorum was in after about a virtual second: the round stopped waiting at the straggler
    # cutoff (federation.straggler_min_s), not at its deadline.
    assert records[1].excluded == {"alpine": "straggler"}
    assert records[2].contributors == ["alpine", "coastal", "delta", "highland"]


def test_lost_quorum_stops_with_one_clear_sentence(in_repo: Path, tmp_path: Path) -> None:
    result = run_cli(
        "simulate",
        "--json",
        "-o",
        str(tmp_path / "q"),
        *SMALL,
        "--rounds",
        "3",
        *NO_BASELINES,
        "--set",
        "federation.max_round_retries=1",
        "--faults",
        "drop:alpine@1,drop:coastal@1",
    )
    assert result.code == 1
    assert "error: round 1 reached only 2 of 3 required contributors in 2 attempts" in result.err
    assert "Traceback" not in result.err
    # --json callers get the failure on stdout too.
    assert json.loads(result.out) == {
        "code": "fault_tolerance_exceeded",
        "error": json.loads(result.out)["error"],
        "exit_code": 1,
    }
    records = Ledger(tmp_path / "q" / "ledger.jsonl").records()
    assert [(r.round, r.state) for r in records] == [(0, "closed"), (1, "aborted"), (1, "aborted")]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--faults", "drop:nobody@1"], "names 'nobody', which is not a participant"),
        (["--faults", "explode@1"], "is not valid"),
        (["--set", "federation.rounds=0"], "federation.rounds"),
        (["--participants", "0"], "--participants"),
        (["--rounds", "2", "--faults", "drop:alpine@5"], "targets round 5, but the run has 2"),
    ],
)
def test_bad_flags_exit_2_with_the_reason(
    in_repo: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    result = run_cli("simulate", "-o", str(tmp_path / "x"), *args)
    assert result.code == 2
    assert message in result.err
    assert "Traceback" not in result.err


def test_an_unusable_output_folder_is_refused_before_any_work(
    in_repo: Path, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n", encoding="utf-8")
    result = run_cli("simulate", "-o", str(blocker / "run"), "--rounds", "1")
    assert result.code == 2
    # One line: what is wrong, then the fix, in one sentence.
    [line] = result.err.splitlines()
    assert line.startswith(f"error: cannot create the output folder {blocker / 'run'}")
    assert line.endswith("pass a writable folder with --output-dir or set run.output_dir.")
    assert "collecting data" not in result.err and "Traceback" not in result.err


@pytest.mark.slow
def test_best_reported_ends_with_the_best_scored_version(in_repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "best"
    summary = _simulate(out, "--rounds", "4", "--set", "federation.final_model=best_reported")
    kept = summary["final_model"]
    assert isinstance(kept, dict)
    records = [r for r in Ledger(out / "ledger.jsonl").records() if r.state == "closed"]
    scores = [r.defences["best_reported"]["score"] for r in records]
    best = min(range(len(scores)), key=lambda v: (scores[v], v))
    # The last version (v4) is scored by nobody: the run keeps the best scored one.
    assert (kept["version"], kept["last_version"]) == (best, 4)
    assert summary["model_hash"] == kept["model_hash"] == records[best].parent_hash
    assert summary["model_hash"] != _chain(out)[-1]
    assert "kept v" in kept["why"]
    # The summary's union error is the kept version's: round best - 1 scored it.
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    union = {m["round"] + 1: m["federated"]["union"]["k_step_error"] for m in lines}
    assert summary["federated_union_k_step_error"] == union[best]
    assert summary["federated_union_k_step_error"] != union[4]
