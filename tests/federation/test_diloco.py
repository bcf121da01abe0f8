"""DiLoCo's outer step against hand-computed values and torch.optim.SGD; canonical mean."""

from __future__ import annotations

import itertools

import pytest
import torch

from lensemble.federation.diloco import OuterStep, canonical_mean, pseudo_gradient, zeros_like


def test_two_participants_two_parameters_by_hand() -> None:
    theta = {"w": torch.tensor([1.0, 2.0])}
    local_a = {"w": torch.tensor([0.5, 1.0])}
    local_b = {"w": torch.tensor([1.5, 1.0])}
    deltas = {"a": pseudo_gradient(theta, local_a), "b": pseudo_gradient(theta, local_b)}
    # Delta = theta_t - theta_c: a = [0.5, 1.0], b = [-0.5, 1.0]; mean g = [0.0, 1.0].
    assert torch.equal(deltas["a"]["w"], torch.tensor([0.5, 1.0]))
    g = canonical_mean(deltas)
    assert torch.equal(g["w"], torch.tensor([0.0, 1.0]))

    step = OuterStep(lr=0.5, momentum=0.9, nesterov=True)
    theta1, v1 = step.apply(theta, g, zeros_like(theta))
    # v1 = g = [0, 1]; u = g + 0.9 v1 = [0, 1.9]; theta1 = theta - 0.5 u = [1.0, 1.05].
    assert torch.allclose(v1["w"], torch.tensor([0.0, 1.0]))
    assert torch.allclose(theta1["w"], torch.tensor([1.0, 1.05]), atol=1e-6)
    theta2, v2 = step.apply(theta1, g, v1)
    # v2 = 0.9 [0, 1] + [0, 1] = [0, 1.9]; u = [0, 1] + 0.9 [0, 1.9] = [0, 2.71];
    # theta2 = [1.0, 1.05 - 1.355] = [1.0, -0.305].
    assert torch.allclose(v2["w"], torch.tensor([0.0, 1.9]), atol=1e-6)
    assert torch.allclose(theta2["w"], torch.tensor([1.0, -0.305]), atol=1e-6)

    plain = OuterStep(lr=0.5, momentum=0.9, nesterov=False)
    p1, m1 = plain.apply(theta, g, zeros_like(theta))
    p2, _ = plain.apply(p1, g, m1)
    # Heavy-ball: theta1 = [1, 2 - 0.5*1] = [1, 1.5]; theta2 = [1, 1.5 - 0.5*1.9] = [1, 0.55].
    assert torch.allclose(p1["w"], torch.tensor([1.0, 1.5]))
    assert torch.allclose(p2["w"], torch.tensor([1.0, 0.55]), atol=1e-6)


@pytest.mark.parametrize("nesterov", [True, False])
def test_matches_torch_sgd(nesterov: bool) -> None:
    # Same maths as torch.optim.SGD; torch may fuse multiply-adds, so compare to float32 rounding.
    g = torch.Generator().manual_seed(1)
    theta = {"a": torch.randn(5, 4, generator=g), "b": torch.randn(7, generator=g)}
    grads = [{k: torch.randn(v.shape, generator=g) for k, v in theta.items()} for _ in range(4)]
    step = OuterStep(lr=0.7, momentum=0.9, nesterov=nesterov)
    ours, momentum = dict(theta), zeros_like(theta)
    for grad in grads:
        ours, momentum = step.apply(ours, grad, momentum)
    ref = {k: torch.nn.Parameter(v.clone()) for k, v in theta.items()}
    opt = torch.optim.SGD(
        list(ref.values()), lr=0.7, momentum=0.9, nesterov=nesterov, foreach=False
    )
    for grad in grads:
        for k, p in ref.items():
            p.grad = grad[k].clone()
        opt.step()
    for k in theta:
        assert torch.allclose(ours[k], ref[k].detach(), rtol=1e-6, atol=1e-6)


def test_canonical_mean_is_independent_of_arrival_order() -> None:
    g = torch.Generator().manual_seed(2)
    deltas = {pid: {"x": torch.randn(1000, generator=g) * 1e3} for pid in "abcde"}
    reference = canonical_mean(deltas)["x"]
    for order in itertools.permutations("abcde"):
        shuffled = {pid: deltas[pid] for pid in order}
        assert torch.equal(canonical_mean(shuffled)["x"], reference)


def test_canonical_mean_divides_by_actual_contributors() -> None:
    deltas = {"a": {"x": torch.tensor([3.0])}, "b": {"x": torch.tensor([6.0])}}
    assert canonical_mean(deltas)["x"].item() == 4.5
    with pytest.raises(ValueError):
        canonical_mean({})


@pytest.mark.parametrize("contributors", [1, 2, 5])
def test_blocked_canonical_mean_is_the_whole_tensor_sum_bit_for_bit(contributors: int) -> None:
    # The mean runs in cache-sized blocks; each element must still see the same float32 sums
    # as the plain loop (the committed hash chain depends on it): sizes across block edges,
    # a matrix, a non-contiguous input, a scalar and an empty tensor.
    from lensemble.federation.diloco import MEAN_BLOCK

    g = torch.Generator().manual_seed(contributors)
    shapes = {"big": (2 * MEAN_BLOCK + 3,), "edge": (MEAN_BLOCK,), "matrix": (300, 229)}
    deltas: dict[str, dict[str, torch.Tensor]] = {}
    for pid in "edcba"[:contributors]:
        d = {name: torch.randn(shape, generator=g) * 1e3 for name, shape in shapes.items()}
        d["big"][:10] = -0.0
        d["strided"] = torch.randn(64, 50, generator=g).t()  # not contiguous
        d["scalar"] = torch.randn((), generator=g)
        d["empty"] = torch.empty(0)
        deltas[pid] = d
    got = canonical_mean(deltas)
    order = sorted(deltas)
    for name in deltas[order[0]]:
        want = torch.zeros(deltas[order[0]][name].shape)
        for pid in order:
            want = want + deltas[pid][name]
        want = want / torch.tensor(float(contributors))
        assert got[name].shape == want.shape and got[name].dtype == torch.float32
        assert torch.equal(
            got[name].reshape(-1).view(torch.int32), want.reshape(-1).view(torch.int32)
        )
