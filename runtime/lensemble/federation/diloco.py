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

from collections.abc import Iterator, Mapping
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


#: Elements per block of :func:`canonical_mean` and the spooled mean (1 MiB of float32): the
#: accumulator's block stays in cache while every update adds into it, so each update is read
#: from memory once and the accumulator written once. Smaller blocks paid more in per-block
#: calls than they saved (docs/performance.md#block-sizes-and-buffers-of-the-hot-path). Any
#: size gives the same bits.
MEAN_BLOCK = 1 << 18


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

    def at(
        self,
        version: int,
        lr_half_life: float | None,
        momentum_half_life: float | None,
        lr_hold: int | None = None,
    ) -> OuterStep:
        """This step as scheduled for the model ``version`` (the version it steps from).

        Each coefficient halves every ``*_half_life`` rounds (``c * 0.5 ** (version / h)``,
        computed in float64 and rounded once to float32 by :meth:`step`); None keeps it
        constant. ``lr_hold`` rounds pass before the learning rate starts to halve
        (``lr * 0.5 ** (max(0, version - hold) / h)``). A function of the version alone, so a
        resumed run and every substrate take the same steps.
        """
        lr = self.lr
        if lr_half_life is not None:
            lr = self.lr * 0.5 ** (max(0, version - (lr_hold or 0)) / lr_half_life)
        momentum = (
            self.momentum
            if momentum_half_life is None
            else self.momentum * 0.5 ** (version / momentum_half_life)
        )
        return OuterStep(lr, momentum, self.nesterov)

    def step(
        self, param: torch.Tensor, mean_delta: torch.Tensor, momentum: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One tensor's outer SGD step; pure (new tensors, inputs unchanged).

        Args:
            param: ``theta_t`` of one tensor (float32).
            mean_delta: ``g`` of that tensor, the canonical-order mean pseudo-gradient.
            momentum: ``v_{t-1}`` of that tensor (zeros before the first step).

        Returns:
            ``(theta_{t+1}, v_t)`` of that tensor, float32, shaped like ``param``.
        """
        lr = torch.tensor(self.lr, dtype=torch.float32)
        mu = torch.tensor(self.momentum, dtype=torch.float32)
        g = mean_delta.to(torch.float32)
        # v = mu * m + g; update = g + mu * v (Nesterov) or v; theta - lr * update. Each product
        # and sum is the same float32 operation as written out in one expression (both
        # commute), computed into two buffers instead of six temporaries.
        v = torch.mul(momentum, mu).add_(g)
        update = torch.mul(v, mu).add_(g).mul_(lr) if self.nesterov else torch.mul(v, lr)
        return torch.sub(param.to(torch.float32), update), v

    def apply(
        self,
        params: Mapping[str, torch.Tensor],
        mean_delta: Mapping[str, torch.Tensor],
        momentum: Mapping[str, torch.Tensor],
    ) -> tuple[Params, Params]:
        """One outer SGD step over every tensor; pure (inputs are not modified).

        Args:
            params: ``theta_t`` (float32).
            mean_delta: ``g``, the canonical-order mean pseudo-gradient (float32).
            momentum: ``v_{t-1}`` per tensor (zeros before the first step).

        Returns:
            ``(theta_{t+1}, v_t)``, both name -> float32 tensor.
        """
        new_params: Params = {}
        new_momentum: Params = {}
        for name in sorted(params):
            new_params[name], new_momentum[name] = self.step(
                params[name], mean_delta[name], momentum[name]
            )
        return new_params, new_momentum

    def candidate(
        self,
        params: Mapping[str, torch.Tensor],
        mean_delta: Mapping[str, torch.Tensor],
        momentum: Mapping[str, torch.Tensor],
    ) -> Mapping[str, torch.Tensor]:
        """``theta_{t+1}`` computed tensor by tensor as it is read, none of it kept.

        For a check that reads each new tensor once before the step is taken
        (:func:`~lensemble.federation.robustness.precommit_problem`): it costs one tensor of
        memory instead of a model. The values are :meth:`apply`'s, bit for bit.
        """
        return _Candidate(self, params, mean_delta, momentum)

    def apply_in_place(
        self, params: Params, mean_delta: Mapping[str, torch.Tensor], momentum: Params
    ) -> None:
        """:meth:`apply`, written into the tensors of ``params`` and ``momentum`` themselves.

        Each tensor's new values are copied into it as soon as they are computed: the step
        needs one tensor of memory beyond its inputs instead of two models, and allocates no
        model-sized buffer that would be faulted in again every round.

        Args:
            params: ``theta_t`` (float32, contiguous), overwritten with ``theta_{t+1}``.
            mean_delta: ``g`` (float32).
            momentum: ``v_{t-1}`` (float32, contiguous), overwritten with ``v_t``.
        """
        for name in sorted(params):
            new_param, new_momentum = self.step(params[name], mean_delta[name], momentum[name])
            params[name].copy_(new_param)
            momentum[name].copy_(new_momentum)


class _Candidate(Mapping[str, torch.Tensor]):
    """A read-only view whose items are :meth:`OuterStep.step`'s new parameters."""

    def __init__(
        self,
        outer: OuterStep,
        params: Mapping[str, torch.Tensor],
        mean_delta: Mapping[str, torch.Tensor],
        momentum: Mapping[str, torch.Tensor],
    ) -> None:
        self._outer, self._params, self._mean, self._momentum = outer, params, mean_delta, momentum

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._outer.step(self._params[name], self._mean[name], self._momentum[name])[0]

    def __iter__(self) -> Iterator[str]:
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)


def zeros_like(params: Mapping[str, torch.Tensor]) -> Params:
    """Float32 zeros with the shapes of ``params`` (the initial momentum buffer)."""
    return {name: torch.zeros_like(t, dtype=torch.float32) for name, t in params.items()}
