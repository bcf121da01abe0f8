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


#: Elements per block of :func:`canonical_mean` (256 KB of float32): the accumulator's block
#: stays in the CPU's L2 cache while every update adds into it, so each update is read from
#: memory once and the accumulator written once (not read and written once per update).
#: Measured in ``bench/runtime_overhead.py``; any size gives the same bits.
MEAN_BLOCK = 1 << 16


def canonical_mean(deltas: Mapping[str, Mapping[str, torch.Tensor]]) -> Params:
    """Mean of the contributors' pseudo-gradients, summed in sorted participant-id order.

    Every element of the result is ``((0 + d_0) + d_1) + ... + d_{n-1}``, then divided by
    ``n``, in float32, with ``d_i`` the update of the i-th id in sorted order. The sums run
    block by block (:data:`MEAN_BLOCK` elements), which changes no element's sequence of
    additions, so the bits are the same as a whole-tensor loop.

    Args:
        deltas: Participant id -> pseudo-gradient (name -> float32 tensor); at least one.

    Returns:
        Name -> float32 mean, shaped like the inputs. The result depends only on the set of
        contributions, never on the order they arrived in.

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
        first = deltas[order[0]][name]
        rest = [deltas[pid][name].to(torch.float32).reshape(-1) for pid in order[1:]]
        acc = torch.empty(first.shape, dtype=torch.float32)
        flat_acc, flat_first = acc.view(-1), first.to(torch.float32).reshape(-1)
        for start in range(0, flat_acc.numel(), MEAN_BLOCK):
            end = start + MEAN_BLOCK
            block = flat_acc[start:end]
            # ``d_0 + 0.0`` is ``0.0 + d_0`` bit for bit (-0.0 becomes +0.0), without first
            # writing a block of zeros.
            torch.add(flat_first[start:end], 0.0, out=block)
            for delta in rest:
                block.add_(delta[start:end])
            block.div_(count)
        mean[name] = acc
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
