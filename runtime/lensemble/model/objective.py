"""The JEPA-style training objective of the world model, with an anti-collapse regularizer.

From the first observation of a window the encoder gives ``z_0``; the predictor is unrolled over
the window's actions, and each predicted latent is compared with the target encoder's latent of
the observation actually reached (a joint-embedding predictive architecture: the loss lives in
latent space, never in observation space; LeCun 2022, "A Path Towards Autonomous Machine
Intelligence"). The target is the online encoder under stop-gradient, or an exponential moving
average of it (``model.target``).

A predictor and encoder can reach zero prediction error by mapping everything to one point, so
a regularizer on the online latents keeps them spread out (``model.regularizer``):

- ``vicreg``: a hinge pushing each latent dimension's standard deviation up to 1, plus the
  squared off-diagonal covariances (decorrelation), with VICReg's 25:1 ratio of variance to
  covariance weight (Bardes, Ponce and LeCun, "VICReg", arXiv 2105.04906, Sec. 3.1).
- ``sigreg``: latents are projected on random unit directions and each 1-D marginal is pushed
  towards N(0, 1) with the Epps-Pulley characteristic-function statistic (Balestriero and LeCun,
  "LeJEPA", arXiv 2511.08544, SIGReg). The directions come from the caller's generator, so each
  step's regularizer is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from lensemble.model.worldmodel import WorldModel

Regularizer = Literal["vicreg", "sigreg"]

# VICReg (arXiv 2105.04906) weights variance and covariance 25 : 1.
_VICREG_COVARIANCE_RATIO = 1.0 / 25.0
_VICREG_EPS = 1e-4
# SIGReg: number of random directions and the quadrature of the Epps-Pulley integral.
SIGREG_DIRECTIONS = 32
_SIGREG_T_MAX = 3.0
_SIGREG_POINTS = 17


@dataclass(frozen=True)
class LossTerms:
    """One step's loss and its parts.

    Attributes:
        total: Scalar tensor to minimise (carries the graph).
        prediction: Mean squared latent prediction error over the window (detached scalar).
        regularizer: Anti-collapse term before its weight (detached scalar).
    """

    total: torch.Tensor
    prediction: torch.Tensor
    regularizer: torch.Tensor


def vicreg_regularizer(latents: torch.Tensor) -> torch.Tensor:
    """VICReg variance hinge plus off-diagonal covariance (arXiv 2105.04906, Eq. 1-4).

    Args:
        latents: ``[N, D]`` latents (N >= 2).

    Returns:
        Scalar: ``mean_d relu(1 - std_d) + (1/25) * sum_{i != j} C_ij^2 / D``.
    """
    n, d = latents.shape
    centered = latents - latents.mean(dim=0)
    std = torch.sqrt(centered.pow(2).sum(dim=0) / (n - 1) + _VICREG_EPS)
    variance = torch.relu(1.0 - std).mean()
    cov = centered.T @ centered / (n - 1)
    off_diagonal = cov.pow(2).sum() - torch.diagonal(cov).pow(2).sum()
    return variance + _VICREG_COVARIANCE_RATIO * off_diagonal / d


def sigreg_regularizer(latents: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """SIGReg: Epps-Pulley distance of random 1-D projections from N(0, 1) (arXiv 2511.08544).

    For each of :data:`SIGREG_DIRECTIONS` random unit directions ``u``, the empirical
    characteristic function of ``x = latents @ u`` is compared with ``exp(-t^2 / 2)`` and the
    weighted squared gap ``|phi_x(t) - exp(-t^2/2)|^2 exp(-t^2/2)`` is integrated over
    ``t in [0, 3]`` (trapezoid rule); the result is averaged over directions. Unlike the test
    statistic it is not multiplied by ``N``, so its scale does not grow with the batch size.

    Args:
        latents: ``[N, D]`` latents.
        generator: Source of the random directions (seeded by the caller, one draw per step).

    Returns:
        Scalar, 0 when every projection is exactly standard normal in distribution.
    """
    return sigreg_statistic(latents, sigreg_directions(latents, generator))


def sigreg_directions(latents: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """SIGReg's random unit directions for ``latents`` (``[N, D]``): ``[D, M]``, one draw."""
    d = latents.shape[-1]
    directions = torch.randn(d, SIGREG_DIRECTIONS, generator=generator).to(
        device=latents.device, dtype=latents.dtype
    )
    unit: torch.Tensor = directions / directions.norm(dim=0, keepdim=True)
    return unit


def sigreg_statistic(latents: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
    """SIGReg's Epps-Pulley distance (:func:`sigreg_regularizer`) along given ``directions``.

    Args:
        latents: ``[N, D]`` latents.
        directions: ``[D, M]`` unit directions (:func:`sigreg_directions`).

    Returns:
        Scalar, 0 when every projection is exactly standard normal in distribution.
    """
    projected = latents @ directions  # [N, M]
    t = torch.linspace(
        0.0, _SIGREG_T_MAX, _SIGREG_POINTS, dtype=latents.dtype, device=latents.device
    )
    angles = projected.unsqueeze(-1) * t  # [N, M, P]
    gaussian = torch.exp(-0.5 * t.pow(2))
    gap = (torch.cos(angles).mean(dim=0) - gaussian).pow(2) + torch.sin(angles).mean(dim=0).pow(2)
    integral = torch.trapezoid(gap * gaussian, t, dim=-1)  # [M]
    return integral.mean()


def jepa_loss(
    model: WorldModel,
    obs: torch.Tensor,
    actions: torch.Tensor,
    *,
    regularizer: Regularizer,
    weight: float,
    generator: torch.Generator,
    target_encoder: Callable[[torch.Tensor], torch.Tensor] | None = None,
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
    directions: torch.Tensor | None = None,
) -> LossTerms:
    """The JEPA loss of a batch of windows.

    Args:
        model: The online world model.
        obs: ``[B, W+1, obs_dim]`` observations of each window.
        actions: ``[B, W, action_dim]`` actions of each window.
        regularizer: ``vicreg`` or ``sigreg`` (``model.regularizer``).
        weight: Weight of the regularizer (``model.regularizer_weight``).
        generator: Random source of SIGReg's directions (unused by VICReg).
        target_encoder: Encoder of the targets (an EMA copy); ``None`` uses the online encoder
            under stop-gradient.
        gather: Maps this process's ``[N, D]`` latents to the whole batch's before the
            regularizer (a rank group's all-gather); ``None`` keeps them as they are.
        directions: SIGReg's ``[D, M]`` directions drawn beforehand (:func:`sigreg_directions`;
            DP-SGD draws them once for every record of a step); ``None`` draws them from
            ``generator``.

    Returns:
        The total loss and its parts.
    """
    latents = model.encode(obs)  # [B, W+1, D]
    if target_encoder is None:
        targets = latents[:, 1:].detach()
    else:
        with torch.no_grad():
            targets = target_encoder(obs[:, 1:])
    predicted = model.rollout(latents[:, 0], actions)  # [B, W, D]
    prediction = (predicted - targets).pow(2).mean()
    flat = latents.reshape(-1, latents.shape[-1])
    if gather is not None:
        flat = gather(flat)
    if regularizer == "vicreg":
        reg = vicreg_regularizer(flat)
    elif directions is not None:
        reg = sigreg_statistic(flat, directions)
    else:
        reg = sigreg_regularizer(flat, generator)
    total = prediction + weight * reg
    return LossTerms(total=total, prediction=prediction.detach(), regularizer=reg.detach())
