"""The one door from Lensemble's data layer to the vendored stable-worldmodel environments.

stable-worldmodel (``third_party/stable_worldmodel``, docs/how-to/vendoring.md) registers gymnasium
environments under ``swm/...`` ids whose physics can be varied per instance. This module makes
the vendored, patched tree importable and re-exposes only what the data layer uses:
:func:`is_worldmodel_env` and :func:`make_env`. Every vendored import happens inside a function,
so importing this module costs nothing and needs neither the tree nor the ``[worldmodel]``
extra.

Offline use: the classic-control ids (``swm/PendulumControl-v1``, ``swm/CartPoleControl-v1``,
``swm/AcrobotControl-v1``, ``swm/MountainCarControl-v0``,
``swm/MountainCarContinuousControl-v0``) need only gymnasium, numpy and loguru and download
nothing; so do ``swm/SimplePointMaze-v0`` and ``swm/Piecewise-v0``. Other ids need upstream's
own optional stacks (MuJoCo, pymunk, opencv, torchvision, ...), which Lensemble does not install.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lensemble.errors import ConfigError, ConfigProblem, ToolMissing

if TYPE_CHECKING:
    import gymnasium

#: Prefix of the environment ids stable-worldmodel registers.
WORLDMODEL_PREFIX = "swm/"

#: Environment variable that points at ``third_party/`` when Lensemble is not run from a
#: source checkout (e.g. an installed wheel next to a synced checkout).
THIRD_PARTY_ENV = "LENSEMBLE_THIRD_PARTY"

_INSTALL_HINT = "pip install -c constraints.txt -e '.[train,worldmodel]'"


def is_worldmodel_env(env_id: str) -> bool:
    """True for the ids stable-worldmodel registers (``swm/...``); imports nothing."""
    return env_id.startswith(WORLDMODEL_PREFIX)


def third_party_dir() -> Path | None:
    """Where the vendored trees live, or None for an installed wheel outside a checkout.

    ``$LENSEMBLE_THIRD_PARTY`` when set, else ``third_party/`` of the source checkout this
    package runs from (an editable install).
    """
    configured = os.environ.get(THIRD_PARTY_ENV)
    if configured:
        return Path(configured)
    # In a checkout this file is runtime/lensemble/data/vendored_envs.py: the root is three levels
    # up and holds pyproject.toml. Installed under site-packages, nothing there says so.
    root = Path(__file__).resolve().parents[3]
    if (root / "pyproject.toml").is_file() and (root / "third_party").is_dir():
        return root / "third_party"
    return None


def use_vendored(project: str, import_name: str) -> Path:
    """Make ``third_party/<project>/src`` importable, ahead of any installed copy.

    Args:
        project: Directory under ``third_party/``, e.g. ``stable_worldmodel``.
        import_name: Top-level package the tree provides, e.g. ``stable_worldmodel``.

    Returns:
        The ``src`` folder now on ``sys.path``.

    Raises:
        ToolMissing: The tree is not synced, this package is installed outside a checkout and
            $LENSEMBLE_THIRD_PARTY is unset, or another copy of the package is already imported.
    """
    third_party = third_party_dir()
    if third_party is None:
        raise ToolMissing(
            f"the vendored {project} comes from a source checkout, and this lensemble is "
            f"installed outside one with {THIRD_PARTY_ENV} unset.",
            remediation=f"set {THIRD_PARTY_ENV} to the third_party/ folder of a checkout where "
            f"`python -m tools.vendor sync {project}` has run, or run from that checkout.",
        )
    src = third_party / project / "src"
    if not (src / import_name).is_dir():
        raise ToolMissing(
            f"the vendored {project} is missing ({src} has no {import_name}/).",
            remediation=f"run `python -m tools.vendor sync {project}` from the repository root "
            f"and install the [worldmodel] extra (`{_INSTALL_HINT}`), or set {THIRD_PARTY_ENV} to "
            "a synced third_party/ folder.",
        )
    loaded = sys.modules.get(import_name)
    origin = getattr(loaded, "__file__", None) if loaded is not None else None
    if origin is not None and not Path(origin).resolve().is_relative_to(src.resolve()):
        raise ToolMissing(
            f"{import_name} is already imported from {origin}, not from the vendored tree {src}.",
            remediation=f"uninstall that copy (pip uninstall {import_name.replace('_', '-')}).",
        )
    if str(src) not in sys.path:
        sys.path.insert(0, str(src))
    return src


def _missing_dependency(exc: ImportError, what: str) -> ToolMissing:
    return ToolMissing(
        f"{what} needs the Python package '{exc.name or exc}', which is not installed.",
        remediation=f"install the [worldmodel] extra ({_INSTALL_HINT}); ids beyond the "
        "classic-control ones also need stable-worldmodel's own [env] dependencies.",
    )


def _registered_ids() -> set[str]:
    use_vendored("stable_worldmodel", "stable_worldmodel")
    try:
        with warnings.catch_warnings():
            # Upstream warns on import when the optional Atari package is absent.
            warnings.filterwarnings("ignore", message="ale-py not found")
            from stable_worldmodel.envs import WORLDS
    except ImportError as exc:
        raise _missing_dependency(exc, "the vendored stable-worldmodel") from None
    return set(WORLDS)


def worldmodel_env_ids() -> list[str]:
    """Every ``swm/...`` id the vendored stable-worldmodel registers, sorted.

    Raises:
        ToolMissing: The tree is not synced or the ``[worldmodel]`` extra is not installed.
    """
    return sorted(_registered_ids())


def _physics_values(env_id: str, env: Any, env_params: Mapping[str, float]) -> dict[str, Any]:
    """``physics.<name>`` values for the variation space, each checked against its bounds."""
    import numpy as np

    try:
        space = env.get_wrapper_attr("variation_space")
    except AttributeError:
        space = None
    physics: Any = space.spaces.get("physics") if space is not None else None
    known: list[str] = sorted(physics.spaces) if physics is not None else []
    values: dict[str, Any] = {}
    problems: list[ConfigProblem] = []
    for key, value in sorted(env_params.items()):
        if key not in known:
            choice = f"use one of {', '.join(known)}" if known else "it has no physics variations"
            problems.append(
                ConfigProblem(
                    path=f"env_params.{key}",
                    message=f"'{key}' is not a physics parameter of {env_id}; {choice}.",
                )
            )
            continue
        box = physics.spaces[key]
        low, high = float(np.min(box.low)), float(np.max(box.high))
        if not low <= float(value) <= high:
            problems.append(
                ConfigProblem(
                    path=f"env_params.{key}",
                    message=f"{value} is outside the range {low:g} to {high:g} that {env_id} "
                    f"allows for '{key}'; pick a value in it.",
                )
            )
            continue
        values[f"physics.{key}"] = np.full(box.shape, value, dtype=box.dtype)
    if problems:
        raise ConfigError(problems)
    return values


def make_env(env_id: str, env_params: Mapping[str, float]) -> gymnasium.Env:
    """Create a stable-worldmodel environment with this participant's physics.

    The physics become the variation space's initial values, so every ``reset()`` (whatever
    its seed) runs with them; without ``env_params`` upstream's defaults apply. Nothing is
    downloaded.

    Args:
        env_id: A ``swm/...`` id, e.g. ``swm/PendulumControl-v1``.
        env_params: Physics overrides by name, e.g. ``{"g": 12.0, "m": 0.8}`` (units of the
            upstream environment: Pendulum's ``g`` in m/s², ``m`` in kg, ``l`` in m, ``dt`` in s).

    Returns:
        The gymnasium environment (with gymnasium's standard wrappers, e.g. the time limit).

    Raises:
        ConfigError: The id is not a stable-worldmodel environment, or a parameter is unknown or
            outside the range the environment allows.
        ToolMissing: The tree is not synced, or a package the environment needs is missing.
    """
    if not is_worldmodel_env(env_id):
        raise ConfigError(
            [
                ConfigProblem(
                    path="data.env_id",
                    message=f"'{env_id}' is not a stable-worldmodel id; those start with "
                    f"'{WORLDMODEL_PREFIX}'.",
                )
            ]
        )
    registered = _registered_ids()
    if env_id not in registered:
        control = sorted(i for i in registered if "Control-" in i and "DMControl" not in i)
        raise ConfigError(
            [
                ConfigProblem(
                    path="data.env_id",
                    message=f"'{env_id}' is not registered by stable-worldmodel; the "
                    f"classic-control ids need nothing beyond the [worldmodel] extra: "
                    f"{', '.join(control)}.",
                )
            ]
        )
    import gymnasium as gym

    try:
        env = gym.make(env_id)
    except ImportError as exc:
        raise _missing_dependency(exc, env_id) from None
    try:
        values = _physics_values(env_id, env, env_params)
        if values:
            env.get_wrapper_attr("variation_space").set_init_value(values)
    except BaseException:
        env.close()
        raise
    return env
