"""Rank layouts: the federation default, per-participant overrides, and the rules on them."""

from __future__ import annotations

from pathlib import Path

import pytest

from lensemble.config import load_config
from lensemble.errors import ConfigError


def test_default_is_one_gloo_rank(in_repo: Path) -> None:
    cfg = load_config("config/local.yaml")
    for pid in cfg.participant_ids:
        layout = cfg.rank_layout(pid)
        assert (layout.world_size, layout.backend, layout.mixed_precision) == (1, "gloo", "none")


def test_participant_override_changes_only_its_fields(in_repo: Path) -> None:
    cfg = load_config(
        "config/local.yaml",
        [
            "federation.ranks.max_restarts=5",
            "federation.participants[0].ranks.processes_per_node=2",
        ],
    )
    first = cfg.federation.participants[0].id
    layout = cfg.rank_layout(first)
    assert layout.processes_per_node == 2 and layout.world_size == 2
    assert layout.max_restarts == 5  # inherited from federation.ranks
    others = [pid for pid in cfg.participant_ids if pid != first]
    assert all(cfg.rank_layout(pid).world_size == 1 for pid in others)


@pytest.mark.parametrize(
    ("overrides", "path", "words"),
    [
        (
            ["federation.ranks.processes_per_node=40"],
            "federation.ranks.processes_per_node",
            "training episodes",
        ),
        (
            ["federation.participants[1].ranks.nodes=30"],
            "federation.participants[1].ranks.processes_per_node",
            "training episodes",
        ),
        (["federation.ranks.backend=nccl"], "federation.ranks.backend", "CUDA image"),
        (
            ["federation.ranks.backend=nccl", "deployment.image.tag=0.1.0-cu126"],
            "federation.ranks.processes_per_node",
            "GPUs",
        ),
        (["federation.ranks.mixed_precision=bf16"], "federation.ranks.mixed_precision", "nccl"),
        (
            ["federation.ranks.processes_per_node=3"],
            "federation.ranks.processes_per_node",
            "equal shards",
        ),
        (
            ["federation.participants[0].ranks.processes_per_node=2", "model.target=ema"],
            "federation.participants[0].ranks.processes_per_node",
            "stop_gradient",
        ),
    ],
)
def test_bad_layout_names_the_field_and_fix(
    in_repo: Path, overrides: list[str], path: str, words: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config("config/local.yaml", overrides)
    matching = [p for p in err.value.problems if p.path == path]
    assert matching, [p.path for p in err.value.problems]
    assert words in matching[0].message


def test_nccl_with_cuda_image_and_gpus_is_valid(in_repo: Path) -> None:
    cfg = load_config(
        "config/local.yaml",
        [
            "federation.ranks.backend=nccl",
            "federation.ranks.mixed_precision=bf16",
            "federation.ranks.processes_per_node=2",
            "deployment.image.tag=0.1.0-cu126",
            "deployment.resources.participant.gpu=2",
        ],
    )
    assert cfg.rank_layout(cfg.participant_ids[0]).backend == "nccl"
