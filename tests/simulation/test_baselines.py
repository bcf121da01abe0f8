"""The baselines a federated run is judged against, and how the summary reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from lensemble.config import load_config
from lensemble.config.schema import LensembleConfig
from lensemble.data.trajectories import load_or_collect
from lensemble.federation.checkpoint import CheckpointStore
from lensemble.federation.diloco import OuterStep
from lensemble.model.inner_loop import WorldModelLearner, initial_global_parameters
from lensemble.simulation.baselines import FEDAVG, DilocoRun, PooledRun, pooled_data
from lensemble.simulation.in_process import run_in_process
from lensemble.simulation.report import score_curves, write_report_png
from lensemble.simulation.summary import RoundMetrics, best_round, best_single_site
from tests.model.conftest import params_digest
from tests.support.small_world import SMALL_WORLD_MODEL

REPO = Path(__file__).resolve().parents[2]

TINY = [
    "federation.participant_count=3",
    "federation.quorum=2",
    "federation.rounds=2",
    "federation.inner_steps=3",
    *SMALL_WORLD_MODEL,
]


def _config(out: Path, *overrides: str) -> LensembleConfig:
    return load_config(REPO / "config" / "local.yaml", [*TINY, *overrides, f"run.output_dir={out}"])


def _datasets(config: LensembleConfig) -> dict[str, Any]:
    return {pid: load_or_collect(config, pid) for pid in config.participant_ids}


def test_diloco_run_with_the_configs_outer_step_is_the_coordinators_model(
    tmp_path: Path,
) -> None:
    config = _config(
        tmp_path,
        "evaluation.local_only_baseline=false",
        "evaluation.pooled_oracle=false",
        "evaluation.fedavg_ablation=false",
    )
    result = run_in_process(config)
    o = config.federation.outer_optimizer
    run = DilocoRun(config, _datasets(config), OuterStep(o.lr, o.momentum, o.nesterov))
    committed = CheckpointStore(tmp_path).load()
    assert committed is not None and committed.model_hash == result.model_hash
    assert params_digest(run.train_until(2)) == params_digest(committed.params)


@pytest.mark.parametrize(
    "setting",
    [
        "federation.quantization=int8",
        "federation.quantization=bf16",
        "federation.outer_optimizer.momentum_half_life_rounds=1",
    ],
)
def test_diloco_run_follows_the_wire_format_and_the_schedule(tmp_path: Path, setting: str) -> None:
    # Issue 39's grid trains the federation with DilocoRun: each update must cross the config's
    # wire format, and the outer step follow its schedule, as the coordinator's do.
    config = _config(
        tmp_path,
        setting,
        "evaluation.local_only_baseline=false",
        "evaluation.pooled_oracle=false",
        "evaluation.fedavg_ablation=false",
    )
    result = run_in_process(config)
    o = config.federation.outer_optimizer
    datasets = _datasets(config)
    run = DilocoRun(config, datasets, OuterStep(o.lr, o.momentum, o.nesterov), scheduled=True)
    committed = CheckpointStore(tmp_path).load()
    assert committed is not None and committed.model_hash == result.model_hash
    assert params_digest(run.train_until(2)) == params_digest(committed.params)
    assert run.contributors == [tuple(sorted(datasets))] * 2
    plain = _config(tmp_path / "plain", "evaluation.fedavg_ablation=false")
    unscheduled = DilocoRun(plain, _datasets(plain), OuterStep(o.lr, o.momentum, o.nesterov))
    assert params_digest(unscheduled.train_until(2)) != params_digest(committed.params)


def test_fedavg_makes_the_global_model_the_mean_of_the_local_models(tmp_path: Path) -> None:
    config = _config(tmp_path)
    datasets = _datasets(config)
    theta0 = initial_global_parameters(config)
    local = [
        WorldModelLearner(config, pid, datasets[pid]).train_round(theta0, 0, 3).params
        for pid in sorted(datasets)
    ]
    fedavg = DilocoRun(config, datasets, FEDAVG, robust=False).train_until(1)
    for name, value in fedavg.items():
        mean = torch.stack([p[name] for p in local]).mean(0)
        torch.testing.assert_close(value, mean, rtol=0, atol=1e-6)


def test_the_pooled_oracle_trains_on_everyones_data_with_the_federations_steps(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    datasets = _datasets(config)
    pooled = pooled_data(datasets)
    assert pooled.train.episodes == sum(d.train.episodes for d in datasets.values())
    assert pooled.holdout.episodes == sum(d.holdout.episodes for d in datasets.values())
    run = PooledRun(config, datasets)
    assert run.steps == 3 * config.federation.inner_steps
    run.train_until(1)
    stepwise = params_digest(run.train_until(2))  # continues from round 1
    assert stepwise == params_digest(PooledRun(config, datasets).train_until(2))
    with pytest.raises(ValueError, match="at least one"):
        pooled_data({})


def _report(error: float) -> dict[str, Any]:
    return {"k_steps": 5, "union": {"k_step_error": error, "probe_r2": 0.5}, "participants": {}}


def test_best_site_and_best_round_pick_the_lowest_union_error() -> None:
    local = {"b": _report(0.2), "a": _report(0.3), "c": _report(0.2)}
    assert best_single_site(local) == ("b", 0.2)
    assert best_single_site({}) is None
    lines = [RoundMetrics(r, "h", [], None, 0, 0, 0.0, 0.0) for r in range(4)]
    for line, error in zip(lines, (0.5, 0.1, 0.1, 0.2), strict=True):
        line.federated = _report(error)
    lines[0].federated = None
    assert best_round(lines) == (1, 0.1)  # the ledger's 0-based round (issue 41, item 7)
    assert best_round(lines[:1]) is None
    lines[3].pooled_oracle = _report(0.05)
    assert best_round(lines, "pooled_oracle") == (3, 0.05)


def test_the_report_plots_every_baseline_and_cumulative_bytes(tmp_path: Path) -> None:
    metrics = [
        {
            "round": r,
            "bytes_up": 100,
            "bytes_down": 100,
            "federated": _report(1.0 / (r + 1)),
            "local_only": {"a": _report(0.5), "b": _report(0.4)},
            "pooled_oracle": _report(0.3),
            "fedavg": _report(0.6),
        }
        for r in range(3)
    ]
    path = write_report_png(metrics, tmp_path / "report.png", inner_steps=25)
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert write_report_png([], tmp_path / "none.png") is None


def test_the_report_leaves_a_gap_where_an_evaluated_round_lacks_a_score(tmp_path: Path) -> None:
    def line(r: int, **scores: Any) -> dict[str, Any]:
        return {"round": r, "bytes_up": 100, "bytes_down": 100, **scores}

    metrics = [
        line(0, federated=_report(0.5), pooled_oracle=_report(0.3), local_only={"a": _report(0.4)}),
        line(1),  # not evaluated (every_rounds 2): no point, and no gap either
        line(2, federated=None, pooled_oracle=_report(0.2), unscored="checkpoint v3 was pruned"),
        line(3, federated=_report(0.25), pooled_oracle=None, local_only={"a": _report(0.35)}),
        line(5, federated=_report(0.2), pooled_oracle=_report(0.1), local_only={"a": _report(0.3)}),
    ]
    rounds, curves = score_curves(metrics)
    assert rounds == [1, 3, 4, 6]
    assert set(curves) == {"federated", "pooled_oracle", "local_only:a"}  # no FedAvg trained
    nan = float("nan")
    expected = {
        "federated": [0.5, nan, 0.25, 0.2],
        "pooled_oracle": [0.3, 0.2, nan, 0.1],
        "local_only:a": [0.4, nan, 0.35, 0.3],
    }
    for key, values in expected.items():
        assert [str(v) for v in curves[key]] == [str(v) for v in values], key
    path = write_report_png(metrics, tmp_path / "gaps.png", inner_steps=2)
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
