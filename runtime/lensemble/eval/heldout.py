"""Held-out evaluation: how well a world model predicts, and what its latents know.

Two scores, per participant and over the union of every participant's held-out episodes:

- **k-step latent prediction error**: from each held-out time step ``t`` the model encodes
  ``o_t``, unrolls its predictor over the next ``k`` actions (``evaluation.k_steps``), and is
  compared with the encoding of ``o_{t+k}``. The mean squared error (summed over latent
  dimensions) is divided by the total variance of those target latents, so models whose latents
  have different scales compare fairly: 0 is perfect, 1 is no better than always predicting the
  mean latent.
- **linear probe R^2**: a ridge regression (``evaluation.probe_ridge``) from latent to the true
  physical state is fit on the training episodes and scored on the held-out ones; the reported
  R^2 is the mean over state dimensions.

Everything runs on CPU, single-threaded: the model in its own dtype, reductions and the ridge
solve in float64, so a report is reproducible bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from lensemble.machinery.determinism import single_threaded
from lensemble.model.kstep import VARIANCE_FLOOR, KStepErrors, k_step_errors
from lensemble.model.worldmodel import WorldModel, build_model, check_architecture

if TYPE_CHECKING:
    from lensemble.config.schema import LensembleConfig
    from lensemble.data.trajectories import ParticipantData, Trajectories

# Guards the normaliser of a collapsed model (all target latents equal) against division by 0.
_VARIANCE_FLOOR = VARIANCE_FLOOR


@dataclass(frozen=True)
class HeldoutScores:
    """Scores of one model on one set of held-out episodes.

    Attributes:
        k_step_error: Normalised k-step latent prediction error (unitless, >= 0; lower is better).
        probe_r2: Mean R^2 of the linear probe over state dimensions (unitless, <= 1).
        probe_r2_per_dim: R^2 per named state dimension.
        predictions: Number of k-step predictions scored (count).
    """

    k_step_error: float
    probe_r2: float
    probe_r2_per_dim: dict[str, float]
    predictions: int


@dataclass(frozen=True)
class EvalReport:
    """Held-out scores of one model, per participant and over the union of participants.

    Attributes:
        k_steps: Horizon of the prediction error (steps).
        participants: Participant id -> its scores, in sorted id order.
        union: Scores over all participants' held-out episodes together (the probe is fit on
            all their training episodes together).
    """

    k_steps: int
    participants: dict[str, HeldoutScores]
    union: HeldoutScores

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict (floats, ints, strings)."""
        return {
            "k_steps": self.k_steps,
            "participants": {pid: asdict(s) for pid, s in self.participants.items()},
            "union": asdict(self.union),
        }


def _latents(model: WorldModel, episodes: Trajectories) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 latents ``[E*(T+1), D]`` and true states ``[E*(T+1), S]`` of every step."""
    dtype = next(model.parameters()).dtype
    z = model.encode(episodes.obs.to(dtype)).double()
    return z.reshape(-1, z.shape[-1]), episodes.states.double().reshape(
        -1, episodes.states.shape[-1]
    )


def probe_r2(
    train: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    ridge: float,
) -> torch.Tensor:
    """R^2 per state dimension of a ridge regression latent -> state.

    Solves ``(X^T X / N + ridge * I) W = X^T Y / N`` on training latents standardised per
    dimension ``X [N, D]`` and centered states ``Y [N, S]`` (float64), then scores
    ``1 - SSE / SST`` on the test set, with ``SST`` about the test mean. Standardising makes
    the penalty mean the same for models whose latents have different scales.

    Args:
        train: Training latents and states.
        test: Test latents and states.
        ridge: Ridge penalty (``evaluation.probe_ridge``, unitless).

    Returns:
        float64 ``[S]``. A state dimension that is constant on the test set scores 0.
    """
    x, y = train
    x_mean, y_mean = x.mean(0), y.mean(0)
    x_std = x.std(0).clamp_min(_VARIANCE_FLOOR)
    xs, yc = (x - x_mean) / x_std, y - y_mean
    n, d = xs.shape
    gram = xs.T @ xs / n + ridge * torch.eye(d, dtype=torch.float64)
    weights = torch.linalg.solve(gram, xs.T @ yc / n)
    x_test, y_test = test
    residual = y_test - (((x_test - x_mean) / x_std) @ weights + y_mean)
    total = (y_test - y_test.mean(0)).pow(2).sum(0)
    r2 = 1.0 - residual.pow(2).sum(0) / total.clamp_min(_VARIANCE_FLOOR)
    return torch.where(total > _VARIANCE_FLOOR, r2, torch.zeros_like(r2))


def _scores(errors: KStepErrors, r2: torch.Tensor, names: tuple[str, ...]) -> HeldoutScores:
    per_dim = {name: float(v) for name, v in zip(names, r2.tolist(), strict=True)}
    return HeldoutScores(
        k_step_error=errors.score(),
        probe_r2=float(r2.mean()),
        probe_r2_per_dim=per_dim,
        predictions=errors.count,
    )


def evaluate(
    config: LensembleConfig,
    params: Mapping[str, torch.Tensor],
    datasets: Mapping[str, ParticipantData],
) -> EvalReport:
    """Score a world model on held-out episodes, per participant and over their union.

    Args:
        config: The run's config (``model``, ``evaluation.k_steps``, ``evaluation.probe_ridge``).
        params: The model's parameters (name -> tensor, the world model's names and shapes).
        datasets: Participant id -> its data (all for the same environment).

    Returns:
        The report; participants appear in sorted id order.

    Raises:
        ValueError: ``datasets`` is empty.
        ArchitectureMismatch: ``params`` does not match the world model.
    """
    if not datasets:
        raise ValueError("evaluate() needs at least one participant's data")
    ids = sorted(datasets)
    spec = datasets[ids[0]].spec
    model = build_model(config, spec)
    check_architecture(params, dict(model.named_parameters()), "evaluated parameters")
    k, ridge = config.evaluation.k_steps, config.evaluation.probe_ridge
    names = spec.state_names
    with single_threaded(), torch.no_grad():
        model.load_state_dict(dict(params))
        errors = {pid: k_step_errors(model, datasets[pid].holdout, k) for pid in ids}
        train = {pid: _latents(model, datasets[pid].train) for pid in ids}
        test = {pid: _latents(model, datasets[pid].holdout) for pid in ids}
        per = {
            pid: _scores(errors[pid], probe_r2(train[pid], test[pid], ridge), names) for pid in ids
        }
        union_train = tuple(torch.cat([train[p][i] for p in ids]) for i in (0, 1))
        union_test = tuple(torch.cat([test[p][i] for p in ids]) for i in (0, 1))
        union_r2 = probe_r2(union_train, union_test, ridge)  # type: ignore[arg-type]
        union = _scores(KStepErrors.pooled([errors[p] for p in ids]), union_r2, names)
    return EvalReport(k_steps=k, participants=per, union=union)
