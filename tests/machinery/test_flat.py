"""The coordinator's model, momentum and accumulator: named views into one buffer."""

from __future__ import annotations

import pytest
import torch

from lensemble.federation.coordinator import Coordinator
from lensemble.federation.payload import model_hash
from lensemble.machinery.flat import flat_copy, flat_empty, flat_zeros
from tests.support.federation import initial_params, small_config

pytestmark = pytest.mark.unit


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_a_flat_copy_holds_the_same_values_in_one_buffer() -> None:
    source = {
        "b.bias": torch.randn(3, dtype=torch.bfloat16),
        "a.weight": torch.randn(4, 5),
        "c.scalar": torch.tensor(2.5),
    }
    flat = flat_copy(source)
    assert {_storage(t) for t in flat.values()} == {_storage(flat["a.weight"])}
    for name, t in source.items():
        assert flat[name].dtype == torch.float32 and flat[name].shape == t.shape
        assert torch.equal(flat[name], t.to(torch.float32))
    # Sorted by name, back to back: a.weight (20), b.bias (3), c.scalar (1).
    assert [flat[n].storage_offset() for n in sorted(flat)] == [0, 20, 23]
    as_f32 = {name: t.to(torch.float32) for name, t in source.items()}
    assert model_hash(flat, 0, "") == model_hash(as_f32, 0, "")  # the same bytes per tensor


def test_views_do_not_overlap() -> None:
    zeros = flat_zeros({"x": (2, 3), "y": (4,)})
    zeros["x"].fill_(1.0)
    assert torch.count_nonzero(zeros["y"]) == 0
    empty = flat_empty({"x": (2, 3), "y": (4,)})
    assert empty["x"].is_contiguous() and empty["y"].is_contiguous()


def test_the_coordinator_keeps_model_and_momentum_in_one_buffer_each() -> None:
    coordinator = Coordinator(small_config(), initial_params(3))
    for state in (coordinator.params, coordinator.momentum):
        assert len({_storage(t) for t in state.values()}) == 1
    assert _storage(next(iter(coordinator.params.values()))) != _storage(
        next(iter(coordinator.momentum.values()))
    )
