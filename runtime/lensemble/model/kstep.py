"""The k-step latent prediction error of a world model on episodes.

From each time step ``t`` the model encodes ``o_t``, unrolls its predictor over the next ``k``
actions, and is compared with the encoding of ``o_{t+k}``; the mean squared error (summed over
latent dimensions) is divided by the total variance of those target latents, so models whose
latents have different scales compare fairly: 0 is perfect, 1 is no better than always
predicting the mean latent. :class:`KStepErrors` keeps sufficient statistics, so sets of
episodes pool exactly (the union score of :mod:`lensemble.eval.heldout`).

It lives with the model because a participant scores the global model on its own held-out
episodes every round (:meth:`lensemble.model.inner_loop.WorldModelLearner.heldout_loss`, the
report the coordinator's divergence guard reads) as well as the evaluation does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from lensemble.machinery.determinism import single_threaded
from lensemble.model.worldmodel import WorldModel

if TYPE_CHECKING:
    from lensemble.data.trajectories import Trajectories

# Guards the normaliser of a collapsed model (all target latents equal) against division by 0.
VARIANCE_FLOOR = 1e-12


@dataclass
class KStepErrors:
    """Sufficient statistics of the k-step error, so sets can be pooled exactly.

    Attributes:
        squared_error: float64 scalar: sum over predictions of ``||z_hat - z||^2``.
        target_sum: float64 ``[D]``: sum of the target latents.
        target_sq_sum: float64 ``[D]``: sum of their squares.
        count: Predictions (count).
    """

    squared_error: torch.Tensor
    target_sum: torch.Tensor
    target_sq_sum: torch.Tensor
    count: int

    def score(self) -> float:
        """The normalised error of the pooled predictions (unitless, >= 0)."""
        mean = self.target_sum / self.count
        variance = (self.target_sq_sum / self.count - mean.pow(2)).clamp_min(0).sum()
        mse = self.squared_error / self.count
        return float(mse / variance.clamp_min(VARIANCE_FLOOR))

    @staticmethod
    def pooled(parts: list[KStepErrors]) -> KStepErrors:
        """The statistics of every part's predictions together."""
        return KStepErrors(
            squared_error=sum(
                (p.squared_error for p in parts), torch.zeros((), dtype=torch.float64)
            ),
            target_sum=torch.stack([p.target_sum for p in parts]).sum(0),
            target_sq_sum=torch.stack([p.target_sq_sum for p in parts]).sum(0),
            count=sum(p.count for p in parts),
        )


def k_step_errors(model: WorldModel, episodes: Trajectories, k: int) -> KStepErrors:
    """Unroll ``k`` steps from every start ``t in [0, T-k]`` of every episode at once."""
    dtype = next(model.parameters()).dtype
    latents = model.encode(episodes.obs.to(dtype))  # [E, T+1, D]
    starts = episodes.steps - k + 1
    predicted = latents[:, :starts]
    for j in range(k):
        predicted = model.predict(predicted, episodes.actions[:, j : j + starts].to(dtype))
    targets = latents[:, k : k + starts].double().reshape(-1, latents.shape[-1])
    errors = (predicted.double().reshape(-1, latents.shape[-1]) - targets).pow(2).sum()
    return KStepErrors(errors, targets.sum(0), targets.pow(2).sum(0), int(targets.shape[0]))


def heldout_error(
    model: WorldModel, params: Mapping[str, torch.Tensor], episodes: Trajectories, k: int
) -> float | None:
    """The k-step error of ``params`` on ``episodes``: what a participant reports each round.

    Args:
        model: A world model of the right architecture; its parameters are overwritten.
        params: The parameters to score (name -> tensor; cast to the model's dtype).
        episodes: The participant's held-out episodes.
        k: ``evaluation.k_steps``.

    Returns:
        The normalised error (unitless), computed on one thread without randomness (the same
        bits on every run), or None when there is nothing to score or it is not finite.
    """
    if episodes.obs.shape[0] == 0 or episodes.steps < k:
        return None
    with single_threaded(), torch.no_grad():
        model.load_state_dict(dict(params))
        score = k_step_errors(model, episodes, k).score()
    return score if math.isfinite(score) else None
