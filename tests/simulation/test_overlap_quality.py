"""bench/overlap_quality.py: the overlapped variants' bases, names and table."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from lensemble.config import load_config
from lensemble.config.schema import LensembleConfig
from lensemble.data.trajectories import load_or_collect
from lensemble.federation.diloco import OuterStep
from lensemble.simulation.baselines import DilocoRun
from tests.support.small_world import SMALL_WORLD_MODEL

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import overlap_quality as bench  # noqa: E402

TINY = [
    "federation.participant_count=3",
    "federation.quorum=2",
    "federation.rounds=3",
    "federation.inner_steps=2",
    *SMALL_WORLD_MODEL,
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[LensembleConfig, dict[str, Any]]:
    out = tmp_path_factory.mktemp("overlap")
    config = load_config(REPO / "config" / "local.yaml", [*TINY, f"run.output_dir={out}"])
    return config, {pid: load_or_collect(config, pid) for pid in config.participant_ids}


def _outer(config: LensembleConfig) -> OuterStep:
    o = config.federation.outer_optimizer
    return OuterStep(o.lr, o.momentum, o.nesterov)


def _run(tiny: tuple[LensembleConfig, dict[str, Any]], kind: str, weight: float = 0.0) -> Any:
    config, datasets = tiny
    return bench.OverlappedRun(config, datasets, _outer(config), kind, weight).train_until(3)


def _equal(a: Any, b: Any) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_blocking_is_the_coordinators_diloco_and_the_variants_differ_from_it(
    tiny: tuple[LensembleConfig, dict[str, Any]],
) -> None:
    config, datasets = tiny
    blocking = _run(tiny, "blocking")
    assert _equal(blocking, DilocoRun(config, datasets, _outer(config)).train_until(3))
    delayed = _run(tiny, "delayed")
    assert not _equal(delayed, blocking)
    # mix with a local weight of 0 trains from G_{t-1} alone: the delayed variant, bit for bit.
    assert _equal(_run(tiny, "mix", 0.0), delayed)
    assert not _equal(_run(tiny, "mix", 0.75), delayed)
    assert not _equal(_run(tiny, "eager"), delayed)


def test_round_zero_trains_from_the_initial_model_in_every_variant(
    tiny: tuple[LensembleConfig, dict[str, Any]],
) -> None:
    config, datasets = tiny
    expected = DilocoRun(config, datasets, _outer(config)).train_until(1)
    for kind, weight in (("delayed", 0.0), ("eager", 0.0), ("mix", 0.75)):
        run = bench.OverlappedRun(config, datasets, _outer(config), kind, weight)
        assert _equal(run.train_until(1), expected), kind


def test_variant_names_and_refusals() -> None:
    field = "federation.outer_optimizer"
    assert bench.parse_variant("blocking:") == ("blocking", "blocking", 0.0, [])
    assert bench.parse_variant(f"mix:0.75:{field}.momentum=0,{field}.lr=0.5") == (
        "mix:0.75 momentum=0,lr=0.5",
        "mix",
        0.75,
        [f"{field}.momentum=0", f"{field}.lr=0.5"],
    )
    with pytest.raises(SystemExit, match="one of blocking"):
        bench.parse_variant("streaming:")
    with pytest.raises(SystemExit, match="A a number"):
        bench.parse_variant("mix:half:")


def test_table_gives_each_seed_against_blocking_of_the_same_n_and_rounds() -> None:
    rows = [
        {"variant": "blocking", "n": 4, "rounds": 20, "seed": 1, "final": 0.04},
        {"variant": "blocking", "n": 4, "rounds": 20, "seed": 2, "final": 0.05},
        {"variant": "mix:0.75", "n": 4, "rounds": 20, "seed": 2, "final": 0.06},
        {"variant": "mix:0.75", "n": 4, "rounds": 20, "seed": 1, "final": 0.02},
        {"variant": "mix:0.75", "n": 8, "rounds": 20, "seed": 1, "final": 0.03},
    ]
    lines = bench.table(rows).splitlines()
    mix4 = next(line for line in lines if line.startswith("| mix:0.75 | 4 |"))
    assert "| 2 | 0.0400 | 0.500, 1.200 | 1.200 |" in mix4
    # No blocking run at N = 8: no ratio rather than one against another N.
    mix8 = next(line for line in lines if line.startswith("| mix:0.75 | 8 |"))
    assert mix8.endswith("| - | - |")
