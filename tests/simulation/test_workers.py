"""Participants and baselines trained side by side give the serial run's results, bit for bit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lensemble.config import load_config
from lensemble.federation.faults import parse_faults
from lensemble.federation.ledger import committed_chain
from lensemble.simulation.in_process import run_in_process
from tests.support.small_world import SMALL_WORLD_MODEL

REPO = Path(__file__).resolve().parents[2]

TINY = [
    "federation.participant_count=4",
    "federation.quorum=2",
    "federation.rounds=3",
    "federation.inner_steps=3",
    *SMALL_WORLD_MODEL,
]
#: Timings: the only fields of a metrics line that may differ between two runs.
TIMING = {"wall_s", "non_compute_s", "compute_s", "seconds"}


def _scores(out: Path) -> list[dict[str, Any]]:
    """Every metrics line without its timings."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in TIMING}
        return value

    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [strip(json.loads(line)) for line in lines]


def _run(out: Path, workers: int, faults: str, *overrides: str) -> tuple[list[str], Any]:
    config = load_config(
        REPO / "config" / "local.yaml", [*TINY, *overrides, f"run.output_dir={out}"]
    )
    plan = parse_faults(faults, config.participant_ids)
    result = run_in_process(config, faults=plan, workers=workers)
    return committed_chain(result.records), _scores(out)


@pytest.mark.parametrize(
    ("faults", "overrides"),
    [
        ("drop:coastal@1,reorder@2,delay:delta@0=5", ()),
        ("alie_omniscient:highland@1-", ()),
        ("", ("federation.aggregation=masking", "federation.quorum=3")),
    ],
    ids=["faults", "omniscient-attack", "masking"],
)
def test_side_by_side_training_commits_the_serial_runs_hashes_and_scores(
    tmp_path: Path, faults: str, overrides: tuple[str, ...]
) -> None:
    serial = _run(tmp_path / "serial", 1, faults, *overrides)
    side_by_side = _run(tmp_path / "side", 3, faults, *overrides)
    assert len(serial[0]) == 3  # three committed rounds
    assert side_by_side == serial
