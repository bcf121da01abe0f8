"""What ``lensemble simulate`` prints, as a person reads it in a pipe, a CI log or ``nohup.out``.

Issue 41: without a terminal a 20-round run printed nothing until its end (items 4, 5); the
final table was wider than 80 columns and its last line was wrapped at 120; the best round was
counted from 1 where the ledger counts from 0, and "1 rounds" (item 7); after ``--resume`` the
best-round figures of the federated model and of the oracle covered only the rounds of the
resumed process, or none (item 8).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import run_cli

# config/local.yaml, smaller (as tests/e2e/test_simulate.py runs it).
SMALL = (
    "--set",
    "data.episodes=12",
    "--set",
    "data.episode_steps=60",
    "--set",
    "federation.inner_steps=15",
)


def _union(report: dict[str, Any]) -> float:
    return float(report["union"]["k_step_error"])


def test_without_a_terminal_each_round_gets_a_line_and_the_table_fits_80_columns(
    in_repo: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    result = run_cli("simulate", "config/local.yaml", "-o", str(out), "-r", "2", *SMALL)
    assert result.code == 0, result.err
    # Captured streams are not terminals: one plain line per round, as it closes.
    rounds = [line for line in result.err.splitlines() if line.startswith("round ")]
    assert [line.split(":")[0] for line in rounds] == ["round 0 committed", "round 1 committed"]
    assert "[1/2 committed," in rounds[0] and "[2/2 committed," in rounds[1]
    assert "━" not in result.err  # no bar drawn into a log
    lines = result.out.splitlines()
    table = lines[: next(i for i, line in enumerate(lines) if line.startswith("Federated"))]
    assert max(len(line) for line in table) <= 80, "\n".join(table)
    assert "after 2 rounds" in table[0]
    union = next(line for line in table if "union" in line)
    assert len(union.split("│")) == 9  # one row, every column on it (7 and the 2 edges)
    wrote = next(line for line in lines if line.startswith("Wrote "))
    assert wrote.endswith(str(out / "report.png"))  # whole, not wrapped mid-path


def test_plurals_and_the_best_round_follow_the_ledger(in_repo: Path, tmp_path: Path) -> None:
    one = run_cli("simulate", "config/local.yaml", "-o", str(tmp_path / "one"), "-r", "1", *SMALL)
    assert one.code == 0, one.err
    assert "1 round x 15 inner steps" in one.err and "1 rounds" not in one.err + one.out
    assert "after 1 round (lower is better)" in one.out
    out = tmp_path / "three"
    result = run_cli("simulate", "config/local.yaml", "--json", "-o", str(out), "-r", "3", *SMALL)
    summary = json.loads(result.out)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    errors = {line["round"]: _union(line["federated"]) for line in metrics}
    best = min(errors, key=lambda r: (errors[r], r))
    assert summary["federated_best_round"] == best  # the ledger's round, 0-based
    assert summary["federated_best_round_union_k_step_error"] == errors[best]


@pytest.mark.slow
def test_a_resumed_run_reports_the_whole_runs_baselines(in_repo: Path, tmp_path: Path) -> None:
    def run(folder: str, rounds: int, *extra: str) -> dict[str, Any]:
        result = run_cli(
            "simulate",
            "config/local.yaml",
            "--json",
            "-o",
            str(tmp_path / folder),
            "-r",
            str(rounds),
            *SMALL,
            *extra,
        )
        assert result.code == 0, result.err
        summary: dict[str, Any] = json.loads(result.out)
        return summary

    straight = run("straight", 3)
    run("resumed", 2)
    resumed = run("resumed", 3, "--resume")
    again = run("resumed", 3, "--resume")  # a finished run: nothing left to train
    figures = [
        key
        for key in straight
        if key.startswith(("federated", "pooled_oracle", "fedavg", "best_single", "local_only"))
    ]
    assert "pooled_oracle_best_round" in figures
    for summary in (resumed, again):
        assert {k: summary[k] for k in figures} == {k: straight[k] for k in figures}
