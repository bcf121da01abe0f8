"""A participant sizes its torch threads to the cores it is given (issue 40)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lensemble.config import load_config
from lensemble.config.schema import LensembleConfig
from lensemble.machinery.cpus import cgroup_quota
from lensemble.network.launch.torch_threads import participant_threads

REPO = Path(__file__).resolve().parents[2]


def _config(cpu: str) -> LensembleConfig:
    config = load_config(REPO / "config/local.yaml")
    resources = config.deployment.resources
    participant = resources.participant.model_copy(update={"cpu": cpu})
    deployment = config.deployment.model_copy(
        update={"resources": resources.model_copy(update={"participant": participant})}
    )
    return config.model_copy(update={"deployment": deployment})


def _cgroup_v2(root: Path, text: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cpu.max").write_text(text)
    return root


@pytest.mark.parametrize(
    ("text", "cores"),
    [("150000 100000\n", 1.5), ("max 100000\n", None), ("200000 100000", 2.0), ("junk", None)],
)
def test_the_cgroup_v2_quota_is_read_in_cores(tmp_path: Path, text: str, cores: float) -> None:
    assert cgroup_quota(_cgroup_v2(tmp_path, text)) == cores


def test_the_cgroup_v1_quota_is_read_and_minus_one_means_none(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu/cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "cpu/cpu.cfs_quota_us").write_text("300000\n")
    assert cgroup_quota(tmp_path) == 3.0
    (tmp_path / "cpu/cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_quota(tmp_path) is None
    assert cgroup_quota(tmp_path / "absent") is None


@pytest.mark.parametrize(
    ("cpu", "affinity", "quota", "threads"),
    [
        ("4", 16, None, 4),  # the config's limit, on a large host
        ("4", 2, None, 2),  # the host has fewer CPUs than the config asks for
        ("4", 16, "150000 100000", 1),  # a container's quota of 1.5 cores: whole cores only
        ("500m", 16, None, 1),  # half a core still gets one thread
        ("8", 8, "max 100000", 8),  # no quota: affinity and config
    ],
)
def test_threads_are_the_whole_cores_of_the_smallest_budget(
    tmp_path: Path, cpu: str, affinity: int, quota: str | None, threads: int
) -> None:
    root = _cgroup_v2(tmp_path, quota) if quota is not None else tmp_path / "none"
    budget = participant_threads(_config(cpu), affinity=affinity, cgroup_root=root)
    assert budget.threads == threads
    assert budget.affinity == affinity
    line = budget.describe()
    assert f"torch threads: {threads} " in line
    assert "deployment.resources.participant.cpu" in line
