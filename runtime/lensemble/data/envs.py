"""Environments a participant collects from, with its own physics, and what they look like.

A participant's environment is a gymnasium environment (or a vendored stable-worldmodel one for
ids starting with ``swm/``) whose physics attributes are overridden with the participant's
``env_params``. That is what makes the sites non-IID. :func:`env_spec` describes the shapes the
world model needs; :func:`true_state` gives the physical state the linear probe regresses onto.

Episodes must have a fixed length (training windows and the k-step evaluation slide over them),
so :func:`make_env` moves the termination thresholds of the built-in environments out of reach:
CartPole keeps integrating its equations of motion after the pole falls or the cart leaves the
track (the pole then swings freely, which the equations describe exactly), and continuous
MountainCar keeps driving after the car reaches the goal. Time limits are ignored by the
collector, which never asks an environment for more than ``data.episode_steps`` steps.

The built-in environments are recognised by the class of the unwrapped environment (their
*family*), so stable-worldmodel's classic-control ids, which wrap gymnasium's own classes, get
the same fixed-length episodes, input scales and true state.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from lensemble.config.physics import KNOWN_PHYSICS
from lensemble.errors import ConfigError, ConfigProblem, ToolMissing

#: Prefix of environment ids served by the vendored stable-worldmodel shim.
SWM_PREFIX = "swm/"

PENDULUM, MOUNTAIN_CAR, CARTPOLE = "pendulum", "mountain-car-continuous", "cartpole"

# Fixed observation scales of the built-in families: (center, half-range) per dimension. They
# are part of the environment, not of any participant's data, so every participant (and the
# federated model) normalises identically.
_OBS_NORMALISATION: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    # (cos theta, sin theta, theta_dot); theta_dot is clipped to +-8 rad/s by the environment.
    PENDULUM: ((0.0, 0.0, 0.0), (1.0, 1.0, 8.0)),
    # (position in [-1.2, 0.6], velocity in [-0.07, 0.07]).
    MOUNTAIN_CAR: ((-0.3, 0.0), (0.9, 0.07)),
    # (x, x_dot, theta, theta_dot): typical ranges of random play past the failure threshold.
    CARTPOLE: ((0.0, 0.0, 0.0, 0.0), (2.4, 3.0, math.pi, 8.0)),
}

# Names of the true physical state used by the linear probe, per family.
_STATE_NAMES: dict[str, tuple[str, ...]] = {
    PENDULUM: ("theta", "theta_dot"),
    MOUNTAIN_CAR: ("position", "velocity"),
    CARTPOLE: ("x", "x_dot", "theta", "theta_dot"),
}


@dataclass(frozen=True)
class EnvSpec:
    """Shapes and scales of an environment, as the world model and the collector see them.

    Attributes:
        env_id: Environment id (``data.env_id``).
        obs_dim: Observation size (count); observations are float32 vectors.
        action_dim: Action size as the model sees it (count): the Box size for continuous
            actions, ``n_actions`` (one-hot) for discrete ones.
        state_dim: Size of the true physical state used by the linear probe (count).
        state_names: Name of each true-state dimension (``obs[i]`` when the observation is
            the state).
        discrete: Whether actions are discrete (stored one-hot).
        n_actions: Number of discrete actions; 0 for continuous actions.
        action_low: Lower bound of each continuous action dimension (environment units); empty
            for discrete actions.
        action_high: Upper bound of each continuous action dimension; empty for discrete.
        obs_center: Per-dimension center subtracted from observations before the encoder.
        obs_scale: Per-dimension scale observations are divided by (so most values lie in
            [-1, 1]); fixed per environment, never estimated from a participant's data.
        family: The built-in family (``pendulum``, ``mountain-car-continuous``, ``cartpole``)
            or None.
    """

    env_id: str
    obs_dim: int
    action_dim: int
    state_dim: int
    discrete: bool
    n_actions: int
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()
    obs_center: tuple[float, ...] = ()
    obs_scale: tuple[float, ...] = ()
    state_names: tuple[str, ...] = ()
    family: str | None = None


def _bad_env_id(env_id: str, why: str) -> ConfigError:
    return ConfigError(
        [ConfigProblem(path="data.env_id", message=f"'{env_id}' {why}")],
    )


def _make_base(env_id: str, env_params: dict[str, float]) -> Any:
    """Construct the environment, through the stable-worldmodel shim for ``swm/`` ids."""
    if env_id.startswith(SWM_PREFIX):
        try:
            shim = importlib.import_module("lensemble.data.vendored_envs")
        except ImportError as exc:
            raise ToolMissing(
                f"data.env_id '{env_id}' needs the vendored stable-worldmodel, which cannot be "
                f"imported ({exc}).",
                remediation="Install the [worldmodel] extra and run `python -m tools.vendor sync` "
                "in the checkout, or choose a gymnasium id such as Pendulum-v1.",
            ) from exc
        return shim.make_env(env_id, env_params)

    import gymnasium

    try:
        # The passive environment checker only warns, and would re-check every new env.
        return gymnasium.make(env_id, disable_env_checker=True)
    except gymnasium.error.Error as exc:
        raise _bad_env_id(
            env_id,
            f"is not a usable gymnasium environment ({exc}); use Pendulum-v1, "
            "MountainCarContinuous-v0, CartPole-v1 or another registered id.",
        ) from exc


def make_env(env_id: str, env_params: dict[str, float]) -> Any:
    """Make a participant's environment with its physics overrides applied.

    Overrides are set as attributes of the unwrapped environment: Pendulum-v1 ``g`` (m/s^2),
    ``m`` (kg), ``l`` (m); MountainCarContinuous-v0 ``power``; CartPole-v1 ``gravity``,
    ``masscart``, ``masspole``, ``length`` (half the pole, m) and ``force_mag`` (N), after which
    CartPole's derived ``total_mass`` and ``polemass_length`` are recomputed. For other ids
    each key must name an existing numeric attribute of the unwrapped environment.

    Termination: CartPole-v1's failure thresholds and MountainCarContinuous-v0's goal are moved
    out of reach so that the physics keeps integrating and every episode has a fixed length
    (see the module docstring).

    Args:
        env_id: ``data.env_id``: a gymnasium id, or ``swm/...`` for the stable-worldmodel shim
            (``lensemble.data.vendored_envs.make_env(env_id, env_params)``, imported lazily; the
            shim applies the overrides itself).
        env_params: The participant's ``env_params``.

    Returns:
        A gymnasium-API environment (``reset(seed=...)``, ``step(action)``).

    Raises:
        ConfigError: ``env_id`` is unknown to gymnasium, or an override names no attribute.
        ToolMissing: A ``swm/`` id was given but the vendored shim cannot be imported.
    """
    env = _make_base(env_id, env_params)
    if not env_id.startswith(SWM_PREFIX):  # the shim applies its own physics
        _apply_physics(env, env_id, env_params)
    _keep_integrating(env)
    return env


def env_family(env: Any) -> str | None:
    """The built-in family of an environment, by the class of the unwrapped environment."""
    from gymnasium.envs.classic_control import (
        CartPoleEnv,
        Continuous_MountainCarEnv,
        PendulumEnv,
    )

    raw = env.unwrapped
    for cls, family in (
        (PendulumEnv, PENDULUM),
        (Continuous_MountainCarEnv, MOUNTAIN_CAR),
        (CartPoleEnv, CARTPOLE),
    ):
        if isinstance(raw, cls):
            return family
    return None


def _keep_integrating(env: Any) -> None:
    """Move CartPole's failure and MountainCar's goal out of reach: fixed-length episodes."""
    family, raw = env_family(env), env.unwrapped
    if family == CARTPOLE:
        raw.x_threshold = math.inf
        raw.theta_threshold_radians = math.inf
    elif family == MOUNTAIN_CAR:
        raw.goal_position = math.inf


def _apply_physics(env: Any, env_id: str, env_params: dict[str, float]) -> None:
    """Set each override as an attribute of the unwrapped environment."""
    raw = env.unwrapped
    known = {p.name for p in KNOWN_PHYSICS.get(env_id, ())}
    for key in sorted(env_params):
        value = float(env_params[key])
        if known and key not in known:
            raise ConfigError(
                [
                    ConfigProblem(
                        path=f"env_params.{key}",
                        message=f"'{key}' is not a physics parameter of {env_id}; use one of "
                        f"{', '.join(sorted(known))}.",
                    )
                ]
            )
        current = getattr(raw, key, None)
        if not isinstance(current, (int, float, np.floating)) or isinstance(current, bool):
            raise ConfigError(
                [
                    ConfigProblem(
                        path=f"env_params.{key}",
                        message=f"{env_id} has no numeric attribute '{key}'; remove it from "
                        "env_params.",
                    )
                ]
            )
        setattr(raw, key, value)
    if env_family(env) == CARTPOLE:
        raw.total_mass = raw.masspole + raw.masscart
        raw.polemass_length = raw.masspole * raw.length


def env_spec(env_id: str) -> EnvSpec:
    """Describe an environment's observation, action and state shapes.

    Builds the environment once with default physics to read its spaces.

    Args:
        env_id: ``data.env_id``.

    Returns:
        The :class:`EnvSpec`. Discrete actions are one-hot, so ``action_dim == n_actions``.

    Raises:
        ConfigError: The observation space is not a flat Box, or the action space is neither
            a flat Box nor Discrete.
        ToolMissing: As :func:`make_env`.
    """
    import gymnasium

    env = make_env(env_id, {})
    try:
        obs_space, act_space = env.observation_space, env.action_space
        if not isinstance(obs_space, gymnasium.spaces.Box) or len(obs_space.shape) != 1:
            raise _bad_env_id(
                env_id,
                f"has observation space {obs_space}; the world model needs a flat Box of "
                "floats, so choose a state-based environment.",
            )
        obs_dim = int(obs_space.shape[0])
        low: tuple[float, ...] = ()
        high: tuple[float, ...] = ()
        if isinstance(act_space, gymnasium.spaces.Discrete):
            n = int(act_space.n)
            discrete, action_dim = True, n
        elif isinstance(act_space, gymnasium.spaces.Box) and len(act_space.shape) == 1:
            discrete, n, action_dim = False, 0, int(act_space.shape[0])
            low = tuple(float(v) for v in act_space.low)
            high = tuple(float(v) for v in act_space.high)
            if not all(math.isfinite(v) for v in (*low, *high)):
                raise _bad_env_id(
                    env_id, "has an unbounded action space; choose one with finite bounds."
                )
        else:
            raise _bad_env_id(
                env_id,
                f"has action space {act_space}; use a flat Box or a Discrete action space.",
            )
        family = env_family(env)
        if family is not None:
            center, scale = _OBS_NORMALISATION[family]
            names = _STATE_NAMES[family]
        else:
            center, scale = _box_normalisation(obs_space.low, obs_space.high)
            names = tuple(f"obs[{i}]" for i in range(obs_dim))
    finally:
        env.close()
    return EnvSpec(
        env_id=env_id,
        obs_dim=obs_dim,
        action_dim=action_dim,
        state_dim=len(names),
        discrete=discrete,
        n_actions=n,
        action_low=low,
        action_high=high,
        obs_center=center,
        obs_scale=scale,
        state_names=names,
        family=family,
    )


def _box_normalisation(
    low: np.ndarray, high: np.ndarray
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Center and half-range of finite Box bounds; 0 and 1 where a bound is infinite."""
    center, scale = [], []
    for lo, hi in zip(low.tolist(), high.tolist(), strict=True):
        if math.isfinite(lo) and math.isfinite(hi) and hi > lo:
            center.append((hi + lo) / 2.0)
            scale.append((hi - lo) / 2.0)
        else:
            center.append(0.0)
            scale.append(1.0)
    return tuple(center), tuple(scale)


def true_state(env: Any, family: str | None, obs: np.ndarray) -> np.ndarray:
    """The true physical state behind the current observation, for the linear probe.

    Pendulum-v1: (theta rad, theta_dot rad/s), theta wrapped to [0, 2 pi) with 0 upright as
    gymnasium measures it, so the wrap-around lies at the upright position, which a
    pendulum visits least (a wrap at the bottom would split its most visited region);
    MountainCarContinuous-v0: (position, velocity); CartPole-v1: (x m, x_dot m/s, theta rad,
    theta_dot rad/s). Any other environment falls back to the observation itself.

    Args:
        env: The environment (after ``reset`` or ``step``).
        family: Its :func:`env_family`.
        obs: The observation just returned, shape ``[obs_dim]``.

    Returns:
        float32 array of shape ``[state_dim]``.
    """
    if family is None:
        return np.asarray(obs, dtype=np.float32)
    state = np.asarray(env.unwrapped.state, dtype=np.float64).copy()
    if family == PENDULUM:
        state[0] = state[0] % (2 * math.pi)
    return state.astype(np.float32)
