"""The shims: clear errors without the vendored tree, and (marked) the real environments."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lensemble.data import vendored_envs as data_wm
from lensemble.errors import EXIT_TOOL, ConfigError, ToolMissing
from lensemble.eval import vendored_planners as eval_wm
from tests.support.tools import require_vendored_worldmodel


def test_is_worldmodel_env_needs_no_vendored_code() -> None:
    assert data_wm.is_worldmodel_env("swm/PendulumControl-v1")
    assert not data_wm.is_worldmodel_env("Pendulum-v1")
    assert not data_wm.is_worldmodel_env("ALE/Pong-v5")


def test_missing_tree_says_to_sync_and_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(data_wm.THIRD_PARTY_ENV, str(tmp_path))
    with pytest.raises(ToolMissing) as err:
        data_wm.make_env("swm/PendulumControl-v1", {})
    assert err.value.exit_code == EXIT_TOOL
    assert "python -m tools.vendor sync stable_worldmodel" in str(err.value)
    assert "[worldmodel]" in str(err.value)


def test_an_installed_package_outside_a_checkout_says_where_the_tree_must_come_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed = tmp_path / "lib" / "python3.11" / "site-packages" / "lensemble" / "data"
    installed.mkdir(parents=True)
    monkeypatch.delenv(data_wm.THIRD_PARTY_ENV, raising=False)
    monkeypatch.setattr(data_wm, "__file__", str(installed / "worldmodel.py"))
    assert data_wm.third_party_dir() is None
    with pytest.raises(ToolMissing) as err:
        data_wm.make_env("swm/PendulumControl-v1", {})
    assert "installed outside" in str(err.value)
    assert f"set {data_wm.THIRD_PARTY_ENV} to the third_party/ folder of a checkout" in str(
        err.value
    )


def test_a_checkout_finds_its_own_third_party(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(data_wm.THIRD_PARTY_ENV, raising=False)
    assert data_wm.third_party_dir() == repo / "third_party"


def test_non_worldmodel_id_and_unknown_planner_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="'Pendulum-v1' is not a stable-worldmodel id"):
        data_wm.make_env("Pendulum-v1", {})
    with pytest.raises(ConfigError, match="unknown planner 'astar'"):
        eval_wm.make_planner("astar", object(), action_space=None, horizon=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="horizon is 0"):
        eval_wm.make_planner("cem", object(), action_space=None, horizon=0)  # type: ignore[arg-type]


@pytest.fixture
def worldmodel() -> None:
    """Skip unless the vendored tree is synced and the extra's loguru is installed."""
    require_vendored_worldmodel()


@pytest.mark.worldmodel
def test_pendulum_runs_with_each_participants_physics(worldmodel: None) -> None:
    import numpy as np

    assert "swm/PendulumControl-v1" in data_wm.worldmodel_env_ids()
    light = data_wm.make_env("swm/PendulumControl-v1", {"g": 6.0, "m": 0.8})
    heavy = data_wm.make_env("swm/PendulumControl-v1", {"g": 14.0, "m": 0.8})
    for env in (light, heavy):
        for seed in (0, 1):  # physics persist across resets whatever the seed
            env.reset(seed=seed)
            assert env.unwrapped.m == pytest.approx(0.8)
    assert (light.unwrapped.g, heavy.unwrapped.g) == (pytest.approx(6.0), pytest.approx(14.0))
    ends = []
    for env in (light, heavy):
        obs, _ = env.reset(seed=3)
        for _ in range(20):
            obs, *_ = env.step(np.array([0.0], dtype=np.float32))
        ends.append(obs)
    assert ends[0].shape == (3,)
    assert not np.allclose(ends[0], ends[1])  # same start and actions, different gravity
    default = data_wm.make_env("swm/PendulumControl-v1", {})
    default.reset(seed=0)
    assert default.unwrapped.g == pytest.approx(10.0)


@pytest.mark.worldmodel
def test_bad_physics_and_unknown_ids_are_config_errors(worldmodel: None) -> None:
    with pytest.raises(ConfigError, match="'gravity' is not a physics parameter") as err:
        data_wm.make_env("swm/PendulumControl-v1", {"gravity": 9.8})
    assert "use one of dt, g, l, m, max_speed, max_torque" in str(err.value)
    with pytest.raises(ConfigError, match="outside the range 5 to 15"):
        data_wm.make_env("swm/PendulumControl-v1", {"g": 30.0})
    with pytest.raises(ConfigError, match="not registered by stable-worldmodel") as err:
        data_wm.make_env("swm/NoSuchEnv-v0", {})
    assert "swm/PendulumControl-v1" in str(err.value)


class _TargetCost:
    """Squared distance of every planned action to 0.3."""

    def get_cost(self, info: dict[str, object], candidates: object) -> object:
        return ((candidates - 0.3) ** 2).sum(dim=(-1, -2))  # type: ignore[operator]


@pytest.mark.worldmodel
@pytest.mark.parametrize("name", ["cem", "icem", "mppi"])
def test_planners_optimise_and_keep_stdout_clean(
    worldmodel: None, name: str, capfd: pytest.CaptureFixture[str]
) -> None:
    import torch

    env = data_wm.make_env("swm/PendulumControl-v1", {})
    planner = eval_wm.make_planner(
        name, _TargetCost(), action_space=env.action_space, horizon=4, num_samples=64, n_steps=10
    )
    actions = planner.solve({"state": torch.zeros(1, 3)})["actions"]
    assert actions.shape == (1, 4, 1)
    cost = _TargetCost().get_cost({}, actions[:, None])
    start = _TargetCost().get_cost({}, torch.zeros_like(actions)[:, None])
    assert float(cost) < 0.25 * float(start)  # planned well below the all-zero plan's cost
    assert capfd.readouterr().out == ""  # patch 0002: timing goes to the log, not stdout


@pytest.mark.worldmodel
def test_importing_vendored_stable_pretraining_leaves_logging_alone(
    worldmodel: None, repo: Path
) -> None:
    pytest.importorskip("omegaconf", reason="the [worldmodel] extra is not installed")
    code = (
        "import logging, sys\n"
        "from lensemble.data.vendored_envs import use_vendored\n"
        "use_vendored('stable_pretraining', 'stable_pretraining')\n"
        "logging.basicConfig(stream=sys.stderr, level=logging.INFO)\n"
        "before = list(logging.root.handlers)\n"
        "import stable_pretraining\n"
        "from loguru import logger\n"
        "logger.info('loguru line')\n"
        "logging.getLogger('app').warning('app line')\n"
        "assert logging.root.handlers == before, logging.root.handlers\n"
        "print('OK')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "OK\n"  # patch 0001: nothing but our own line on stdout
    assert "loguru line" in proc.stderr and "app line" in proc.stderr
