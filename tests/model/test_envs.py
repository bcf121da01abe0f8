"""Environments: shapes, physics overrides, fixed-length episodes, clear errors."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from lensemble.data.envs import env_spec, make_env
from lensemble.data.trajectories import collect
from lensemble.errors import ConfigError, ToolMissing
from tests.support.tools import require_vendored_worldmodel


@pytest.mark.parametrize(
    ("env_id", "obs_dim", "action_dim", "state_dim", "discrete"),
    [
        ("Pendulum-v1", 3, 1, 2, False),
        ("MountainCarContinuous-v0", 2, 1, 2, False),
        ("CartPole-v1", 4, 2, 4, True),
    ],
)
def test_env_spec_of_builtin_environments(
    env_id: str, obs_dim: int, action_dim: int, state_dim: int, discrete: bool
) -> None:
    spec = env_spec(env_id)
    assert (spec.obs_dim, spec.action_dim, spec.state_dim, spec.discrete) == (
        obs_dim,
        action_dim,
        state_dim,
        discrete,
    )
    assert len(spec.obs_center) == len(spec.obs_scale) == obs_dim
    assert all(s > 0 for s in spec.obs_scale)


def _one_step(env_id: str, params: dict[str, float], action: object) -> np.ndarray:
    env = make_env(env_id, params)
    env.reset(seed=3)
    obs, *_ = env.step(action)
    env.close()
    return np.asarray(obs)


def test_pendulum_physics_overrides_change_the_dynamics() -> None:
    env = make_env("Pendulum-v1", {"g": 6.0, "m": 1.4, "l": 0.8})
    assert (env.unwrapped.g, env.unwrapped.m, env.unwrapped.l) == (6.0, 1.4, 0.8)
    torque = np.array([1.0], dtype=np.float32)
    light = _one_step("Pendulum-v1", {"g": 6.0}, torque)
    heavy = _one_step("Pendulum-v1", {"g": 14.0}, torque)
    same = _one_step("Pendulum-v1", {"g": 6.0}, torque)
    assert not np.allclose(light, heavy)
    np.testing.assert_array_equal(light, same)


def test_cartpole_overrides_recompute_derived_masses() -> None:
    raw = make_env("CartPole-v1", {"masscart": 1.5, "masspole": 0.3, "length": 0.9}).unwrapped
    assert raw.total_mass == pytest.approx(1.8)
    assert raw.polemass_length == pytest.approx(0.27)
    assert not np.allclose(
        _one_step("CartPole-v1", {"force_mag": 7.0}, 1), _one_step("CartPole-v1", {}, 1)
    )


def test_cartpole_collects_one_hot_actions_past_the_failure_threshold() -> None:
    obs, actions, states = collect("CartPole-v1", {}, seed=5, episodes=3, steps=80)
    assert obs.shape == (3, 81, 4) and actions.shape == (3, 80, 2) and states.shape == (3, 81, 4)
    assert obs.dtype == actions.dtype == states.dtype == np.float32
    assert set(np.unique(actions).tolist()) == {0.0, 1.0}
    np.testing.assert_array_equal(actions.sum(-1), 1.0)
    # Episodes keep their fixed length although the pole falls past gymnasium's 12 degrees.
    assert np.abs(states[..., 2]).max() > 12 * 2 * math.pi / 360
    assert np.isfinite(obs).all()


def test_mountain_car_continuous_collects_and_power_changes_dynamics() -> None:
    weak = collect("MountainCarContinuous-v0", {"power": 0.0009}, seed=1, episodes=2, steps=50)
    strong = collect("MountainCarContinuous-v0", {"power": 0.0024}, seed=1, episodes=2, steps=50)
    obs, actions, states = weak
    assert obs.shape == (2, 51, 2) and actions.shape == (2, 50, 1)
    assert np.abs(actions).max() <= 1.0
    np.testing.assert_array_equal(actions, strong[1])  # same policy draws...
    assert not np.allclose(obs, strong[0])  # ...different physics
    np.testing.assert_allclose(states, obs)  # (position, velocity) is the observation


def test_unknown_environment_falls_back_to_observations_as_state() -> None:
    spec = env_spec("Acrobot-v1")
    assert spec.discrete and spec.n_actions == 3 and spec.state_dim == spec.obs_dim == 6
    obs, actions, states = collect("Acrobot-v1", {"LINK_MASS_1": 1.3}, seed=2, episodes=2, steps=20)
    np.testing.assert_array_equal(obs, states)
    assert actions.shape == (2, 20, 3)


def test_unknown_env_id_names_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        env_spec("NoSuchEnv-v9")
    assert err.value.problems[0].path == "data.env_id"


def test_unknown_physics_key_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        make_env("Pendulum-v1", {"gravity": 9.0})
    assert err.value.problems[0].path == "env_params.gravity"
    with pytest.raises(ConfigError, match="no numeric attribute"):
        make_env("Acrobot-v1", {"warp_drive": 1.0})


def test_swm_environment_without_the_vendored_shim_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "lensemble.data.vendored_envs", None)  # import fails
    with pytest.raises(ToolMissing, match=r"data\.env_id 'swm/PushT'") as err:
        make_env("swm/PushT", {})
    assert err.value.exit_code == 4


@pytest.fixture
def vendored_worldmodel() -> None:
    """Skip unless the vendored stable-worldmodel is synced and the [worldmodel] extra is in."""
    require_vendored_worldmodel()


@pytest.mark.worldmodel
def test_stable_worldmodel_classic_control_joins_the_same_families(
    vendored_worldmodel: None,
) -> None:
    spec = env_spec("swm/CartPoleControl-v1")
    assert spec.family == "cartpole" and spec.state_names == ("x", "x_dot", "theta", "theta_dot")
    _obs, actions, states = collect("swm/CartPoleControl-v1", {}, seed=5, episodes=2, steps=80)
    assert actions.shape == (2, 80, 2) and np.abs(states[..., 2]).max() > 0.21  # past failure
    light = collect("swm/PendulumControl-v1", {"g": 6.0}, seed=1, episodes=1, steps=20)
    heavy = collect("swm/PendulumControl-v1", {"g": 14.0}, seed=1, episodes=1, steps=20)
    assert light[2].shape == (1, 21, 2)  # (theta, theta_dot), not the observation
    assert not np.allclose(light[0], heavy[0])
