"""Multi-rank participants on Compose: all ranks in one container, sized for them."""

from __future__ import annotations

from pathlib import Path

import pytest

from lensemble.config import LensembleConfig, load_config
from lensemble.errors import ConfigError
from lensemble.render.compose import compose_cpus, compose_memory, render_compose
from lensemble.render.ranks import SHM_PER_RANK_MIB, scale_cpu, scale_memory
from tests.compose.conftest import REPO
from tests.compose.topology import assert_topology
from tests.support.cli import run_cli

#: coastal is the second participant of config/local.yaml.
COASTAL_RANKS = "federation.participants[1].ranks"


def local(*extra: str) -> LensembleConfig:
    return load_config(REPO / "config/local.yaml", ["federation.transport=network", *extra])


def _gpus(service: dict) -> int:
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    return int(device["count"])


def test_a_multi_rank_participant_is_one_container_sized_for_its_ranks() -> None:
    # 3 ranks split a global batch of 96 evenly (the config requires equal shards).
    cfg = local(f"{COASTAL_RANKS}.processes_per_node=3", "federation.inner_optimizer.batch_size=96")
    compose = render_compose(cfg)
    assert_topology(compose, cfg)  # still one service per participant and profile
    per_rank = cfg.deployment.resources.participant
    coastal = compose["services"]["participant-coastal"]
    limits = coastal["deploy"]["resources"]["limits"]
    assert float(limits["cpus"]) == 3 * float(compose_cpus(per_rank.cpu))
    assert limits["memory"] == compose_memory(scale_memory(per_rank.memory, 3))
    assert coastal["shm_size"] == f"{3 * SHM_PER_RANK_MIB}m"
    assert coastal["labels"]["dev.lensemble.ranks"] == "3"
    # The command is the contract with the runtime: unchanged, it launches the ranks itself.
    assert coastal["command"] == ["serve"]
    assert "deploy" in coastal and "reservations" not in coastal["deploy"]["resources"]
    # The gpu profile reserves one GPU per rank.
    assert _gpus(compose["services"]["participant-coastal-gpu"]) == 3
    # Single-rank participants are exactly as before.
    alpine = compose["services"]["participant-alpine"]
    assert "shm_size" not in alpine and "dev.lensemble.ranks" not in alpine["labels"]
    assert alpine["deploy"]["resources"]["limits"]["cpus"] == compose_cpus(per_rank.cpu)
    assert _gpus(compose["services"]["participant-alpine-gpu"]) == 1


def test_single_rank_configs_render_as_before() -> None:
    cfg = local()
    with_default = local("federation.ranks.processes_per_node=1", "federation.ranks.nodes=1")
    assert render_compose(with_default)["services"] == render_compose(cfg)["services"]


def test_nccl_reserves_the_configured_gpus_when_there_are_more() -> None:
    cfg = local(
        "deployment.image.tag=0.1.0-cu126",
        "deployment.resources.participant.gpu=4",
        "federation.ranks.backend=nccl",
        "federation.ranks.processes_per_node=2",
    )
    compose = render_compose(cfg)
    assert _gpus(compose["services"]["participant-delta-gpu"]) == 4


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("federation.ranks.nodes=2", "federation.ranks.nodes"),
        (f"{COASTAL_RANKS}.nodes=2", f"{COASTAL_RANKS}.nodes"),
    ],
)
def test_ranks_on_several_nodes_are_refused_naming_the_field_and_fix(
    override: str, field: str
) -> None:
    with pytest.raises(ConfigError) as info:
        render_compose(local(override))
    problems = info.value.problems
    assert {p.path for p in problems} == {field}
    assert "nodes: 1 and processes_per_node: 2" in problems[0].message
    assert "Kubernetes" in problems[0].message


def test_the_cli_reports_several_nodes_in_one_line(in_repo: Path, tmp_path: Path) -> None:
    result = run_cli(
        "render",
        "compose",
        "--config",
        "config/local.yaml",
        "--set",
        "federation.transport=network",
        "--set",
        f"{COASTAL_RANKS}.nodes=2",
        "-o",
        str(tmp_path / "compose.yaml"),
    )
    assert result.code == 2
    assert f"{COASTAL_RANKS}.nodes" in result.err
    assert "Traceback" not in result.err
    assert not (tmp_path / "compose.yaml").exists()


@pytest.mark.parametrize(
    ("quantity", "factor", "cpu"),
    [("500m", 3, "1500m"), ("1", 2, "2"), ("0.5", 3, "1.5"), ("2", 1, "2")],
)
def test_scale_cpu(quantity: str, factor: int, cpu: str) -> None:
    assert scale_cpu(quantity, factor) == cpu


@pytest.mark.parametrize(
    ("quantity", "factor", "memory"),
    [("1Gi", 2, "2Gi"), ("1.5Gi", 2, "3Gi"), ("512Mi", 3, "1536Mi"), ("1000", 4, "4000")],
)
def test_scale_memory(quantity: str, factor: int, memory: str) -> None:
    assert scale_memory(quantity, factor) == memory
