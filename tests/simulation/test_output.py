"""The output folder of a run on one machine: checks before work, what a new run replaces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lensemble.config import LensembleConfig
from lensemble.config.load import validate_mapping
from lensemble.errors import UsageError
from lensemble.federation.ledger import RoundRecord
from lensemble.simulation.output import (
    append_metrics,
    fresh_output,
    prepare_output_dir,
    read_metrics,
    recover_metrics,
)
from lensemble.simulation.summary import RoundMetrics, SimulationResult, summary
from tests.support.federation import build, small_config


def _config(out: Path, rounds: int = 3) -> LensembleConfig:
    return validate_mapping({"run": {"output_dir": str(out)}, "federation": {"rounds": rounds}})


def _committed_run(out: Path, rounds: int) -> list[RoundRecord]:
    # The divergence guard off: only the last 3 checkpoints are kept (it keeps its best too).
    config = small_config(rounds=rounds, robustness={"guard": {"enabled": False}})
    coordinator, transport, _ = build(config, output_dir=out)
    return coordinator.run(transport).records


def test_prepare_says_what_happens_to_a_previous_run(tmp_path: Path) -> None:
    out = tmp_path / "new" / "run"
    assert prepare_output_dir(_config(out), resume=False) is None
    assert out.is_dir()  # created before any work
    assert "nothing to resume" in str(prepare_output_dir(_config(out), resume=True))
    _committed_run(out, rounds=2)
    note = prepare_output_dir(_config(out), resume=False)
    assert note is not None and "replacing the previous run" in note and "(2 rounds" in note
    finished = prepare_output_dir(_config(out, rounds=2), resume=True)
    assert finished is not None and "already committed all 2 rounds" in finished
    assert "larger --rounds" in finished
    assert prepare_output_dir(_config(out, rounds=3), resume=True) is None  # rounds left
    with pytest.raises(UsageError, match="already committed 2 rounds"):
        prepare_output_dir(_config(out, rounds=1), resume=True)


def test_an_unusable_folder_is_refused_before_any_work(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(UsageError, match="cannot create the output folder"):
        prepare_output_dir(_config(blocker / "run"), resume=False)


def test_fresh_output_keeps_only_the_data_caches(tmp_path: Path) -> None:
    _committed_run(tmp_path, rounds=1)
    data = tmp_path / "participants" / "alpha" / "data" / "cache.bin"
    state = tmp_path / "participants" / "alpha" / "state" / "inner.bin"
    for path in (data, state, tmp_path / "metrics.jsonl", tmp_path / "report.png"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    fresh_output(tmp_path)
    assert data.exists()
    assert not state.exists() and not (tmp_path / "coordinator" / "checkpoints").exists()
    assert not [
        p for p in ("ledger.jsonl", "metrics.jsonl", "report.png") if (tmp_path / p).exists()
    ]


def test_metrics_lines_copy_the_ledger_and_a_resume_drops_the_rounds_it_redoes(
    tmp_path: Path,
) -> None:
    records = _committed_run(tmp_path / "run", rounds=3)
    for record in records:
        append_metrics(tmp_path, RoundMetrics.of(record))
    lines = read_metrics(tmp_path)
    assert [m["round"] for m in lines] == [0, 1, 2]
    assert [m["model_hash"] for m in lines] == [r.model_hash for r in records]
    assert lines[0]["bytes_up"] == records[0].bytes_up > 0
    assert lines[0]["federated"] is None  # not evaluated yet
    assert recover_metrics(tmp_path, records, 2, RoundMetrics.of) == 0
    assert [m["round"] for m in read_metrics(tmp_path)] == [0, 1]
    result = SimulationResult(
        config_hash="c", records=records, metrics=[], model_hash="m", final=None
    )
    as_json = summary(result, None)
    assert as_json["rounds_committed"] == 3 and as_json["hash_chain"][-1] == records[-1].model_hash
    assert as_json["local_only_mean_union_k_step_error"] is None
    assert json.loads(json.dumps(as_json)) == as_json


class _Scores:
    """An ``Evaluation`` stand-in whose scores name what they were computed from."""

    def __init__(self) -> None:
        self.baseline_rounds: list[int] = []

    def score(self, line: RoundMetrics, params: dict, rounds: int) -> None:
        line.federated = {"params_sum": float(sum(float(v.sum()) for v in params.values()))}
        self.score_baselines(line, rounds)

    def score_baselines(self, line: RoundMetrics, rounds: int) -> None:
        self.baseline_rounds.append(rounds)
        line.local_only = {"alpha": {"rounds": rounds}}
        line.pooled_oracle = {"rounds": rounds}
        line.fedavg = {"rounds": rounds}


def test_a_rebuilt_line_carries_every_baseline_a_written_line_has(tmp_path: Path) -> None:
    from lensemble.federation.checkpoint import CheckpointStore
    from lensemble.simulation.scoring import rebuild_metrics

    records = _committed_run(tmp_path, rounds=5)  # checkpoints v3, v4, v5 kept
    config = validate_mapping(
        {"run": {"output_dir": str(tmp_path)}, "federation": {"rounds": 5}}
    )  # every round evaluated
    scores = _Scores()
    kept = rebuild_metrics(config, tmp_path, scores, records[3])  # type: ignore[arg-type]
    ckpt = CheckpointStore(tmp_path).load(4)
    assert ckpt is not None
    assert kept.federated == {"params_sum": sum(float(v.sum()) for v in ckpt.params.values())}
    assert kept.local_only == {"alpha": {"rounds": 4}}
    assert kept.pooled_oracle == kept.fedavg == {"rounds": 4} and kept.unscored is None
    pruned = rebuild_metrics(config, tmp_path, scores, records[0])  # type: ignore[arg-type]
    assert pruned.federated is None and "checkpoint v1 was pruned" in str(pruned.unscored)
    assert pruned.pooled_oracle == pruned.fedavg == {"rounds": 1}  # deterministic: recomputed
    assert json.loads(pruned.to_json())["unscored"] == pruned.unscored
    every_other = validate_mapping(
        {"federation": {"rounds": 5}, "evaluation": {"every_rounds": 2}}
    )  # round 2 (the third) is not evaluated
    plain = rebuild_metrics(every_other, tmp_path, scores, records[2])  # type: ignore[arg-type]
    assert plain.federated is plain.pooled_oracle is plain.fedavg is None
    assert scores.baseline_rounds == [4, 1]
