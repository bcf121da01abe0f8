"""An interrupted simulation leaves no hole in metrics.jsonl: resume rebuilds the lost line."""

from __future__ import annotations

from pathlib import Path

import pytest

from lensemble import durable
from lensemble.config import LensembleConfig
from lensemble.config.load import validate_mapping
from lensemble.durable import SimulatedCrash
from lensemble.simulation.in_process import run_in_process
from lensemble.simulation.output import read_metrics

pytestmark = pytest.mark.integration  # three small world-model runs


def _config(out: Path) -> LensembleConfig:
    return validate_mapping(
        {
            "run": {"output_dir": str(out)},
            "data": {"episodes": 4, "episode_steps": 20},
            "federation": {"rounds": 3, "inner_steps": 2},
            "evaluation": {"every_rounds": 2, "local_only_baseline": False},
        }
    )


@pytest.mark.parametrize("point", ["before-append", "after-append"])
def test_a_crash_around_the_metrics_line_resumes_with_complete_metrics(
    tmp_path: Path, point: str
) -> None:
    reference = run_in_process(_config(tmp_path / "straight"))
    expected = read_metrics(tmp_path / "straight")
    out = tmp_path / "crashed"
    metrics_file = str(out / "metrics.jsonl")
    seen = [0]

    def crash(label: str) -> None:
        # Round 1 (evaluated: every_rounds=2) has committed; its metrics line is next.
        if label == f"{point}:{metrics_file}":
            seen[0] += 1
            if seen[0] == 2:
                raise SimulatedCrash(label)

    durable.set_crash_hook(crash)
    try:
        with pytest.raises(SimulatedCrash):
            run_in_process(_config(out))
    finally:
        durable.set_crash_hook(None)
    assert [m["round"] for m in read_metrics(out)] == ([0] if point == "before-append" else [0, 1])
    resumed = run_in_process(_config(out), resume=True)
    assert resumed.model_hash == reference.model_hash
    lines = read_metrics(out)
    assert [m["round"] for m in lines] == [0, 1, 2]
    assert [m["model_hash"] for m in lines] == [m["model_hash"] for m in expected]
    assert lines[1]["federated"] == expected[1]["federated"]  # re-scored from its checkpoint
    # The baselines on (pooled oracle and FedAvg, the defaults), trained again from the config
    # and seed: the rebuilt line holds the values a line written at the time holds.
    for key in ("pooled_oracle", "fedavg", "local_only", "unscored"):
        assert lines[1][key] == expected[1][key], key
    assert lines[1]["pooled_oracle"] is not None and lines[1]["fedavg"] is not None
    assert [m["pooled_oracle"] for m in lines] == [m["pooled_oracle"] for m in expected]
