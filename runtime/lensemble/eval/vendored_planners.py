"""The one door from Lensemble's evaluation to stable-worldmodel's model-predictive planners.

stable-worldmodel ships sampling-based MPC planners (CEM, iCEM, MPPI) that optimise an action
sequence against a world model's cost (the planner factory). This module re-exposes
only :func:`make_planner`; the vendored code is imported inside it, from the tree that
:func:`lensemble.data.vendored_envs.use_vendored` puts on ``sys.path``. The planners need torch,
gymnasium, numpy and loguru, and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from lensemble.data.vendored_envs import use_vendored
from lensemble.errors import ConfigError, ConfigProblem, ToolMissing

if TYPE_CHECKING:
    import gymnasium
    import torch

#: Planner names :func:`make_planner` accepts.
PLANNERS = ("cem", "icem", "mppi")


class CostModel(Protocol):
    """What a planner plans against: the cost of candidate action sequences.

    ``get_cost(info, candidates)`` receives the observation dict expanded per candidate and a
    float32 tensor of shape ``(n_envs, num_samples, horizon, action_dim)``, and returns a
    float32 tensor of costs of shape ``(n_envs, num_samples)``; lower is better.
    """

    def get_cost(self, info: dict[str, Any], candidates: torch.Tensor) -> torch.Tensor:
        """Cost of each candidate action sequence."""
        ...


@dataclass(frozen=True)
class _Horizon:
    # The two fields upstream's planners read from their config. Upstream's own PlanConfig lives
    # in a module that imports torchvision, which the planners themselves do not need.
    horizon: int
    action_block: int = 1


def make_planner(
    name: str,
    model: CostModel,
    *,
    action_space: gymnasium.spaces.Box,
    horizon: int,
    n_envs: int = 1,
    action_block: int = 1,
    seed: int = 0,
    **options: Any,
) -> Any:
    """A configured stable-worldmodel planner.

    ``planner.solve(info)`` takes a dict of tensors with a leading ``n_envs`` axis and returns
    a dict whose ``"actions"`` is a float32 tensor of shape
    ``(n_envs, horizon, action_dim * action_block)``, the optimised mean action sequence.

    Args:
        name: ``cem``, ``icem`` or ``mppi``.
        model: The cost the planner minimises.
        action_space: One environment's action space (a gymnasium ``Box``).
        horizon: Planning horizon in steps.
        n_envs: Environments planned for at once.
        action_block: How many environment steps each planned action is repeated.
        seed: Seed of the planner's sampling.
        **options: Upstream planner options, e.g. ``num_samples``, ``n_steps``, ``topk``.

    Returns:
        The planner object (upstream's ``CEMSolver``, ``ICEMSolver`` or ``MPPISolver``).

    Raises:
        ConfigError: Unknown planner name, or a horizon, ``n_envs`` or ``action_block`` below 1.
        ToolMissing: The tree is not synced or the ``[worldmodel]`` extra is not installed.
    """
    if name not in PLANNERS:
        raise ConfigError(
            [
                ConfigProblem(
                    "planner", f"unknown planner '{name}'; use one of {', '.join(PLANNERS)}."
                )
            ]
        )
    for field, value in (("horizon", horizon), ("n_envs", n_envs), ("action_block", action_block)):
        if value < 1:
            raise ConfigError([ConfigProblem(field, f"{field} is {value}; it must be at least 1.")])
    use_vendored("stable_worldmodel", "stable_worldmodel")
    try:
        from gymnasium.vector.utils import batch_space
        from stable_worldmodel.solver import CEMSolver, ICEMSolver, MPPISolver
    except ImportError as exc:
        raise ToolMissing(
            f"stable-worldmodel's planners need the Python package '{exc.name or exc}', which is "
            "not installed.",
            remediation="install the [worldmodel] extra: pip install -e '.[worldmodel]'.",
        ) from None
    solver_class = {"cem": CEMSolver, "icem": ICEMSolver, "mppi": MPPISolver}[name]
    planner = solver_class(model, batch_size=n_envs, seed=seed, **options)
    planner.configure(
        action_space=batch_space(action_space, n_envs),
        n_envs=n_envs,
        config=_Horizon(horizon=horizon, action_block=action_block),
    )
    return planner
