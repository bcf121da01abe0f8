"""Issue 39's grid bench (``bench/payoff_grid.py``): its table, its resume, and its final model.

The table's ratios and verdicts are checked on synthetic lines; the resume and the
``best_reported`` choice on a tiny federation against the coordinator's own run.
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from lensemble.config import load_config
from lensemble.data.trajectories import load_or_collect
from lensemble.simulation.in_process import run_in_process
from tests.support.small_world import SMALL_WORLD_MODEL

REPO = Path(__file__).resolve().parents[2]

TINY = [
    "federation.inner_steps=3",
    *SMALL_WORLD_MODEL,
]


@pytest.fixture
def grid(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO / "bench"))  # the bench imports its sibling
    return importlib.import_module("payoff_grid")


def _line(seed: int, final: float, *, kept: float | None = None, **over: Any) -> dict[str, Any]:
    row = {
        "n": 4,
        "rounds": 20,
        "wire": "int8",
        "seed": seed,
        "federated": final,
        "federated_best": 0.90,
        "final": {"last": final, "best_reported": final if kept is None else kept},
        "best_site": 1.0,
        "pooled": 0.8,
        "fedavg": 0.95,
        "local": {"a": 1.0, "b": 1.2},
    }
    row.update(over)
    return row


def _cell_lines(text: str, policy: str) -> list[list[str]]:
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()[2:]]
    return [r for r in rows if r[3] == policy]


def test_the_table_gives_each_ratio_and_target_per_cell(grid: ModuleType) -> None:
    # Five seeds: the last model is 0.94 x the best site everywhere but seed 5 (1.02x), so
    # "below best site" fails; seed 5 is also 1.133x the best round and 1.074x FedAvg, the
    # one FedAvg miss of five (4/5 passes). best_reported keeps 0.91 everywhere.
    lines = [_line(s, 0.94, kept=0.91) for s in (1, 2, 3, 4)] + [_line(5, 1.02, kept=0.91)]
    ratios = grid.ratios(lines[4], "last")
    assert ratios == pytest.approx(
        {"site": 1.02, "pooled": 1.02 / 0.8, "fedavg": 1.02 / 0.95, "best_round": 1.02 / 0.9}
    )
    (last,) = _cell_lines(grid.table(lines), "last")
    assert last[:5] == ["4", "20", "int8", "last", "5 (1,2,3,4,5)"]
    mean_site = (4 * 0.94 + 1.02) / 5
    assert last[5] == f"{mean_site:.3f} (1.020)"
    assert last[6] == f"{mean_site / 0.8:.3f} ({1.02 / 0.8:.3f})"
    assert last[9:] == ["**FAIL**", "**FAIL**", "pass 4/5", "**FAIL**"]
    (best,) = _cell_lines(grid.table(lines), "best_reported")
    assert best[9:] == ["pass", "pass", "pass 5/5", "pass"]
    assert best[8] == f"{0.91 / 0.9:.3f} ({0.91 / 0.9:.3f})"


def test_fedavg_needs_four_of_five_seeds_within_one_percent(grid: ModuleType) -> None:
    within, beyond = 0.95 * 1.01, 0.95 * 1.011
    three = [_line(s, within) for s in (1, 2, 3)] + [_line(s, beyond) for s in (4, 5)]
    assert not grid.verdicts([grid.ratios(r, "last") for r in three])["fedavg"]
    four = [_line(s, within) for s in (1, 2, 3, 4)] + [_line(5, beyond)]
    assert grid.verdicts([grid.ratios(r, "last") for r in four])["fedavg"]
    # Fewer seeds are held to the same 80%: one miss of three fails.
    assert not grid.verdicts([grid.ratios(r, "last") for r in four[2:]])["fedavg"]


def test_cells_are_split_by_n_rounds_and_wire(grid: ModuleType) -> None:
    lines = [_line(7, 0.9), _line(7, 0.9, wire="none"), _line(7, 0.9, rounds=30)]
    cells = [tuple(r[:3]) for r in _cell_lines(grid.table(lines), "last")]
    assert cells == [("4", "20", "none"), ("4", "20", "int8"), ("4", "30", "int8")]


def test_a_resumed_grid_trains_only_the_lines_missing(grid: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "grid.jsonl"
    # Round 1 is already there, with made-up baselines: the resumed run trains rounds 1-2 of
    # the federation again but takes the sites' and the oracle's scores from this line.
    done = _line(7, 0.5, n=3, rounds=1, wire="none", local={"alpine": 9.0}, pooled=8.0)
    out.write_text(json.dumps(done) + "\n" + '{"torn": ')  # and a line cut short
    args = argparse.Namespace(
        config=str(REPO / "config" / "local.yaml"),
        set=TINY,
        participants="3",
        rounds="1,2",
        wire="none",
        seeds="7",
        out=out,
        baselines=[],
    )
    grid.run_grid(args)
    rows = grid.read_rows(out)
    assert [grid.key(r) for r in rows] == [(3, 1, "none", 7), (3, 2, "none", 7)]
    assert rows[0] == done
    assert len(rows[1]["curve"]) == 2 and rows[1]["pooled"] != 8.0  # round 2 was trained
    before = out.read_text()
    grid.run_grid(args)  # nothing left to do
    assert out.read_text() == before
    args.rounds = "1"
    args.wire = "none,int8"
    grid.run_grid(args)
    added = grid.read_rows(out)[2:]
    assert [grid.key(r) for r in added] == [(3, 1, "int8", 7)]
    assert added[0]["pooled"] == 8.0  # the wire format does not change the baselines
    # Another candidate's run borrows these baselines instead of training its own.
    args.out, args.wire, args.baselines = tmp_path / "other.jsonl", "none", [out]
    grid.run_grid(args)
    (borrowed,) = grid.read_rows(args.out)
    assert grid.key(borrowed) == (3, 1, "none", 7) and borrowed["pooled"] == 8.0


def test_the_best_reported_model_is_the_coordinators_choice(
    grid: ModuleType, tmp_path: Path
) -> None:
    overrides = [
        *TINY,
        "federation.participant_count=3",
        "federation.quorum=0",
        "federation.rounds=5",
        "federation.final_model=best_reported",
        # Inner steps too long: the model gets worse after round 2, so the best is not the last.
        "federation.inner_optimizer.lr=0.03",
        "evaluation.local_only_baseline=false",
        "evaluation.pooled_oracle=false",
        "evaluation.fedavg_ablation=false",
        f"run.output_dir={tmp_path}",
    ]
    config = load_config(REPO / "config" / "local.yaml", overrides)
    result = run_in_process(config)
    datasets = {pid: load_or_collect(config, pid) for pid in config.participant_ids}
    federation = grid.Federation(config, datasets)
    federation.advance(5)
    assert result.kept is not None
    assert federation.kept_version(5) == result.kept["version"] < 4
    assert result.final is not None
    row = federation.row(5)
    assert row["final"]["best_reported"] == pytest.approx(result.final["union"]["k_step_error"])
