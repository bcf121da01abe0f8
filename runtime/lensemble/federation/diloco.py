"""DiLoCo's pseudo-gradient, canonical-order mean, and outer Nesterov SGD step.

Source: Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models",
arXiv 2311.08105, Algorithm 1.

Sign convention (defined once, here): participant ``c``'s **pseudo-gradient** in round ``t`` is

    Delta_c = theta_t - theta_c

where ``theta_t`` is the global model the round opened with and ``theta_c`` the participant's
parameters after its ``H`` inner AdamW steps. It points like a gradient (uphill), so the outer
optimizer *subtracts* it, exactly as SGD subtracts a gradient.

The coordinator averages the contributors' pseudo-gradients in float32, summing in sorted
participant-id order (docs/concepts.md#deterministic-aggregation), and divides by the number of
actual contributors (elastic completion). The outer optimizer is SGD with (Nesterov) momentum, as
``torch.optim.SGD(momentum=mu, nesterov=True, dampening=0)`` defines it:

    v_t = mu * v_{t-1} + g          (v_0 = 0)
    u_t = g + mu * v_t              (Nesterov)     or   u_t = v_t   (plain momentum)
    theta_{t+1} = theta_t - lr * u_t

with ``g`` the mean pseudo-gradient. Every operation is elementwise float32 on CPU in a fixed
order, so the result is bit-reproducible; a test checks it against ``torch.optim.SGD``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

Params = dict[str, torch.Tensor]


def pseudo_gradient(
    global_params: Mapping[str, torch.Tensor], local_params: Mapping[str, torch.Tensor]
) -> Params:
    """``Delta_c = theta_t - theta_c`` per tensor, in float32.

    Args:
        global_params: ``theta_t``, the round's global parameters.
        local_params: ``theta_c``, the participant's parameters after its inner steps; same
            names and shapes.

    Returns:
        Name -> float32 tensor.
    """
    return {
        name: global_params[name].to(torch.float32) - local_params[name].to(torch.float32)
        for name in sorted(global_params)
    }


def canonical_mean(deltas: Mapping[str, Mapping[str, torch.Tensor]]) -> Params:
    """Mean of the contributors' pseudo-gradients, summed in sorted participant-id order.

    Args:
        deltas: Participant id -> pseudo-gradient (name -> float32 tensor); at least one.

    Returns:
        Name -> float32 mean. The result depends only on the set of contributions, never on the
        order they arrived in.

    Raises:
        ValueError: ``deltas`` is empty.
    """
    if not deltas:
        raise ValueError("canonical_mean needs at least one contribution")
    order = sorted(deltas)
    names = sorted(deltas[order[0]])
    count = torch.tensor(float(len(order)), dtype=torch.float32)
    mean: Params = {}
    for name in names:
        # In place: one accumulator per tensor, the same float32 additions in the same order.
        # It starts as ``d_0 + 0.0``, which is ``0.0 + d_0`` bit for bit (-0.0 becomes +0.0)
        # without first writing a tensor of zeros.
        acc = deltas[order[0]][name].to(torch.float32).add(0.0)
        for pid in order[1:]:
            acc.add_(deltas[pid][name].to(torch.float32))
        mean[name] = acc.div_(count)
    return mean


@dataclass(frozen=True)
class OuterStep:
    """The outer optimizer's hyper-parameters (``federation.outer_optimizer``)."""

    lr: float
    momentum: float
    nesterov: bool

    def apply(
        self,
        params: Mapping[str, torch.Tensor],
        mean_delta: Mapping[str, torch.Tensor],
        momentum: Mapping[str, torch.Tensor],
    ) -> tuple[Params, Params]:
        """One outer SGD step; pure (inputs are not modified).

        Args:
            params: ``theta_t`` (float32).
            mean_delta: ``g``, the canonical-order mean pseudo-gradient (float32).
            momentum: ``v_{t-1}`` per tensor (zeros before the first step).

        Returns:
            ``(theta_{t+1}, v_t)``, both name -> float32 tensor.
        """
        lr = torch.tensor(self.lr, dtype=torch.float32)
        mu = torch.tensor(self.momentum, dtype=torch.float32)
        new_params: Params = {}
        new_momentum: Params = {}
        for name in sorted(params):
            g = mean_delta[name].to(torch.float32)
            v = mu * momentum[name] + g
            update = g + mu * v if self.nesterov else v
            new_params[name] = params[name].to(torch.float32) - lr * update
            new_momentum[name] = v
        return new_params, new_momentum


def zeros_like(params: Mapping[str, torch.Tensor]) -> Params:
    """Float32 zeros with the shapes of ``params`` (the initial momentum buffer)."""
    return {name: torch.zeros_like(t, dtype=torch.float32) for name, t in params.items()}
