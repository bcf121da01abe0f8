"""The JEPA loss of a global batch split across ranks, with the gradient of the unsplit batch.

Each rank holds ``B / R`` rows of the global batch. The prediction error is a mean over rows,
so the mean over ranks of each rank's mean is the global mean (equal shards). The
anti-collapse regularizer is a statistic of the whole batch (VICReg's covariance, SIGReg's
characteristic function), so each rank computes it on the latents of every rank, gathered with
a differentiable all-gather. With the FSDP2 gradient average over ranks this gives the gradient
of :func:`lensemble.model.objective.jepa_loss` on the global batch (up to float rounding).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from lensemble.model.objective import LossTerms, Regularizer, jepa_loss
from lensemble.model.worldmodel import WorldModel


class _GatherRows(torch.autograd.Function):
    """All-gather along dim 0 whose backward sums every rank's gradient for its own rows.

    torch's own differentiable all-gather emulates its backward with all-to-all on gloo, which
    gloo lacks for lists; an all-reduce of the (small) gathered gradient works on every backend.
    """

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor) -> torch.Tensor:
        world = dist.get_world_size()
        parts = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(parts, local.contiguous())
        ctx.rows = local.shape[0]
        ctx.rank = dist.get_rank()
        return torch.cat(parts)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> torch.Tensor:
        total = grads[0].contiguous().clone()
        dist.all_reduce(total)
        return total[ctx.rank * ctx.rows : (ctx.rank + 1) * ctx.rows]


def gather_rows(local: torch.Tensor) -> torch.Tensor:
    """Every rank's ``local`` concatenated in rank order along dim 0, differentiably.

    Args:
        local: ``[n, ...]`` this rank's rows (the same ``n`` on every rank).

    Returns:
        ``[R * n, ...]``; its gradient reaches each rank's ``local`` summed over all ranks.
    """
    out: torch.Tensor = _GatherRows.apply(local)  # type: ignore[no-untyped-call]
    return out


def sharded_jepa_loss(
    model: WorldModel,
    obs: torch.Tensor,
    actions: torch.Tensor,
    *,
    regularizer: Regularizer,
    weight: float,
    generator: torch.Generator,
) -> LossTerms:
    """This rank's JEPA loss on its rows (stop-gradient target), regularizer on the global batch.

    Args:
        model: The online world model (wrapped by ``fully_shard``).
        obs: ``[B/R, W+1, obs_dim]`` this rank's rows of the global batch.
        actions: ``[B/R, W, action_dim]`` this rank's rows.
        regularizer: ``vicreg`` or ``sigreg``.
        weight: Weight of the regularizer.
        generator: SIGReg's directions (the same state on every rank, so the same directions).

    Returns:
        ``total = prediction_r + weight * regularizer(all latents)``; averaged over ranks (as
        FSDP2 averages gradients) it is the global batch's loss.
    """
    # The all-reduce in the backward sums R equal copies of the regularizer's gradient and FSDP2
    # divides by R: the regularizer enters once, as in the unsplit loss.
    return jepa_loss(
        model,
        obs,
        actions,
        regularizer=regularizer,
        weight=weight,
        generator=generator,
        gather=gather_rows,
    )
