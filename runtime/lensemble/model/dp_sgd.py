"""DP-SGD inner steps: per-record gradients, clipped and noised by Opacus, then the same AdamW.

A record is one training episode of the participant. Each step draws every episode with
probability ``q`` (Poisson sampling), takes ``windows_per_record`` random windows of each drawn
episode, and computes each record's gradient of the JEPA loss of its own windows alone: the
anti-collapse regularizer is taken over the record's own latents, so no record's gradient
depends on another record (per-record clipping bounds a record's influence only then). The
per-record gradients come from ``torch.func`` (``vmap`` over ``grad``): Opacus' hooks assume
one call per layer with the batch first, which the unrolled predictor breaks. Opacus'
``DPOptimizer`` then clips each to ``max_grad_norm``, sums them, adds Gaussian noise of standard
deviation ``sigma * max_grad_norm`` drawn from the participant's secret generator, divides by
the expected number of records ``q * records`` and takes the AdamW step (Abadi et al., CCS'16,
Algorithm 1).

Everything random here (which episodes, which windows, SIGReg's directions, the noise) is drawn
from one generator seeded by the participant's secret seed and the round, so a rerun with the
same secret gives the same bits, and nobody without it can subtract the noise. Opacus'
``secure_mode`` (noise hardened against floating-point attacks, from an unseeded source) is
off, because it cannot be reproduced.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from lensemble.model.objective import jepa_loss, sigreg_directions
from lensemble.model.worldmodel import WorldModel

if TYPE_CHECKING:
    from collections.abc import Callable

    from opacus.optimizers import DPOptimizer

    from lensemble.config.schema import LensembleConfig, PrivacyConfig


class _RecordLoss(nn.Module):
    """The JEPA loss of one record's windows, as a module ``torch.func.functional_call`` runs."""

    def __init__(
        self,
        model: WorldModel,
        config: LensembleConfig,
        target_encoder: Callable[[torch.Tensor], torch.Tensor] | None,
    ) -> None:
        super().__init__()
        self.model = model
        self.regularizer = config.model.regularizer
        self.weight = config.model.regularizer_weight
        self.target_encoder = target_encoder
        self.unused = torch.Generator()  # directions are always given

    def forward(
        self, obs: torch.Tensor, actions: torch.Tensor, directions: torch.Tensor
    ) -> torch.Tensor:
        """Loss of ``obs`` ``[m, W+1, obs_dim]`` and ``actions`` ``[m, W, action_dim]``."""
        terms = jepa_loss(
            self.model,
            obs,
            actions,
            regularizer=self.regularizer,
            weight=self.weight,
            generator=self.unused,
            target_encoder=self.target_encoder,
            directions=directions,
        )
        return terms.total


def dp_optimizer(
    optimizer: torch.optim.Optimizer, privacy: PrivacyConfig, noise_multiplier: float, records: int
) -> DPOptimizer:
    """Opacus' ``DPOptimizer`` around the participant's AdamW (the same moments and state).

    Args:
        optimizer: The inner AdamW.
        privacy: The participant's own settings (``max_grad_norm``, ``sample_rate``).
        noise_multiplier: sigma.
        records: Training episodes (count); the noised sum is divided by ``q * records``.

    Returns:
        The wrapper; its ``generator`` is set per round (:class:`PrivateSteps`).
    """
    from opacus.optimizers import DPOptimizer

    return DPOptimizer(
        optimizer,
        noise_multiplier=noise_multiplier,
        max_grad_norm=privacy.max_grad_norm,
        expected_batch_size=max(1, round(privacy.sample_rate * records)),
        loss_reduction="mean",
        generator=None,
        secure_mode=False,
    )


def draw_records(
    records: int,
    privacy: PrivacyConfig,
    *,
    steps_per_episode: int,
    window: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step's Poisson sample of episodes and the windows of each.

    Args:
        records: Training episodes (count).
        privacy: ``sample_rate`` and ``windows_per_record``.
        steps_per_episode: Actions per episode (count).
        window: Steps per window ``W``.
        generator: The participant's secret generator of the round.

    Returns:
        Drawn episode indices ``[R]`` (int64, R may be 0) and window starts ``[R, m]``.
    """
    drawn = torch.nonzero(torch.rand(records, generator=generator) < privacy.sample_rate)[:, 0]
    starts = torch.randint(
        steps_per_episode - window + 1,
        (drawn.shape[0], privacy.windows_per_record),
        generator=generator,
    )
    return drawn, starts


def per_record_gradients(
    model: WorldModel,
    config: LensembleConfig,
    *,
    obs: torch.Tensor,
    actions: torch.Tensor,
    directions: torch.Tensor,
    target_encoder: Callable[[torch.Tensor], torch.Tensor] | None,
) -> dict[str, torch.Tensor]:
    """Each record's gradient of its own windows' loss (``torch.func``: ``vmap`` of ``grad``).

    Args:
        model: The online model (its current parameters are differentiated).
        config: The run's config (``model.regularizer`` and its weight).
        obs: ``[R, m, W+1, obs_dim]`` windows of R records.
        actions: ``[R, m, W, action_dim]``.
        directions: SIGReg's ``[D, M]`` directions of the step.
        target_encoder: The EMA target's encoder, or None.

    Returns:
        Parameter name -> ``[R, *shape]`` per-record gradients.
    """
    from torch.func import functional_call, grad, vmap

    wrapper = _RecordLoss(model, config, target_encoder)
    params = {f"model.{n}": p.detach() for n, p in model.named_parameters()}

    def loss(p: dict[str, torch.Tensor], o: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = functional_call(wrapper, p, (o, a, directions))
        return out

    grads = vmap(grad(loss), in_dims=(None, 0, 0))(params, obs, actions)
    return {name[len("model.") :]: g for name, g in grads.items()}


def private_step(
    model: WorldModel,
    config: LensembleConfig,
    optimizer: DPOptimizer,
    *,
    privacy: PrivacyConfig,
    data: tuple[torch.Tensor, torch.Tensor],
    generator: torch.Generator,
    target_encoder: Callable[[torch.Tensor], torch.Tensor] | None,
) -> int:
    """One DP-SGD step of ``model`` on a Poisson sample of the participant's episodes.

    Args:
        model: The online model; its parameters take the AdamW step.
        config: The run's config (``data.window``, ``model``).
        optimizer: Opacus' wrapper of the AdamW (:func:`dp_optimizer`), its generator the
            round's secret one.
        privacy: The participant's own settings.
        data: Training observations ``[E, T+1, obs_dim]`` and actions ``[E, T, action_dim]``.
        generator: The round's secret generator (sample, windows, directions; the noise is
            drawn from ``optimizer.generator``, the same object).
        target_encoder: The EMA target's encoder, or None.

    Returns:
        Records drawn in this step (count, may be 0: the step is then noise alone).
    """
    obs, actions = data
    window = config.data.window
    drawn, starts = draw_records(
        obs.shape[0],
        privacy,
        steps_per_episode=actions.shape[1],
        window=window,
        generator=generator,
    )
    directions = sigreg_directions(torch.empty(0, config.model.latent_dim), generator)
    params = dict(model.named_parameters())
    if drawn.shape[0] == 0:
        grads = {n: torch.zeros((0, *p.shape), dtype=p.dtype) for n, p in params.items()}
    else:
        steps = starts[..., None] + torch.arange(window + 1)  # [R, m, W+1]
        episodes = drawn[:, None, None]
        record_obs = obs[episodes, steps]
        record_actions = actions[episodes, steps[..., :-1]]
        grads = per_record_gradients(
            model,
            config,
            obs=record_obs,
            actions=record_actions,
            directions=directions,
            target_encoder=target_encoder,
        )
    optimizer.zero_grad(set_to_none=True)
    for name, p in params.items():
        p.grad_sample = grads[name]  # type: ignore[attr-defined]
    optimizer.step()
    return int(drawn.shape[0])
