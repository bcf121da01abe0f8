"""Physics parameters that a participant may override per environment, and their default spread.

Each participant's environment may run with its own physics (``env_params``), which is what
makes sites non-IID as real consortia are. This module names, for the environments Lensemble
knows, which attributes may be overridden and the range generated participants draw from. It is
plain data so that config validation can check ``env_params`` keys without importing gymnasium.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PhysicsParam:
    """One overridable physics attribute of an environment.

    Attributes:
        name: Attribute name on the unwrapped gymnasium environment.
        default: Upstream default value.
        low: Lower bound of the spread used for generated participants (same unit as default).
        high: Upper bound of that spread.
        minimum: Smallest value that keeps the simulation meaningful (exclusive).
    """

    name: str
    default: float
    low: float
    high: float
    minimum: float = 0.0


#: Environments whose physics may be overridden, by gymnasium id.
KNOWN_PHYSICS: dict[str, tuple[PhysicsParam, ...]] = {
    "Pendulum-v1": (
        PhysicsParam("g", 10.0, 6.0, 14.0),
        PhysicsParam("m", 1.0, 0.6, 1.6),
        PhysicsParam("l", 1.0, 0.7, 1.4),
    ),
    "MountainCarContinuous-v0": (PhysicsParam("power", 0.0015, 0.0009, 0.0024),),
    "CartPole-v1": (
        PhysicsParam("gravity", 9.8, 6.0, 14.0),
        PhysicsParam("masscart", 1.0, 0.6, 1.6),
        PhysicsParam("masspole", 0.1, 0.05, 0.3),
        PhysicsParam("length", 0.5, 0.3, 0.9),
        PhysicsParam("force_mag", 10.0, 7.0, 13.0),
    ),
}

_GOLDEN = 0.6180339887498949


def generated_env_params(env_id: str, index: int) -> dict[str, float]:
    """Physics for the ``index``-th generated participant: spread evenly, deterministic.

    Uses a low-discrepancy (golden-ratio) sequence per parameter so any number of generated
    participants covers the range without two sites sharing physics.

    Args:
        env_id: Gymnasium environment id.
        index: 0-based participant index.

    Returns:
        Parameter name to value, rounded to 4 significant digits; empty for unknown environments.
    """
    params = KNOWN_PHYSICS.get(env_id, ())
    out: dict[str, float] = {}
    for k, p in enumerate(params):
        frac = ((index + 1) * _GOLDEN + k * 0.37) % 1.0
        out[p.name] = float(f"{p.low + frac * (p.high - p.low):.4g}")
    return out
