"""The model hash computed on the hashing thread while the pre-commit check runs."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

import pytest
import torch

from lensemble.errors import PayloadError
from lensemble.federation.diloco import OuterStep
from lensemble.federation.payload import TensorDigest, model_hash, model_hash_behind, tensor_digest
from lensemble.federation.robustness import precommit_problem
from lensemble.machinery import hash_behind
from lensemble.machinery.hash_behind import hashing_thread

pytestmark = pytest.mark.unit


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {
        "b.bias": torch.randn(7, generator=g).to(torch.bfloat16),
        "a.weight": torch.randn(4, 5, generator=g),
        "c.codes": torch.randint(-128, 127, (9,), dtype=torch.int8, generator=g),
        "d.scalar": torch.tensor(2.5),
    }


def test_the_hash_behind_equals_model_hash_for_every_dtype() -> None:
    tensors = _tensors()
    with model_hash_behind(5, "sha256:parent") as hasher:
        for name in sorted(tensors):
            hasher.add(name, tensors[name])
        got = hasher.result(sorted(tensors))
    assert got == model_hash(tensors, 5, "sha256:parent")
    assert got != model_hash(tensors, 6, "sha256:parent")


def test_the_incremental_digest_is_tensor_digest() -> None:
    tensors = _tensors()
    digest = TensorDigest()
    for name in sorted(tensors):
        digest.add(name, tensors[name])
    assert digest.hexdigest(b"suffix") == tensor_digest(tensors, b"suffix")
    # hexdigest does not consume the state: the same digest can be read twice.
    assert digest.hexdigest(b"suffix") == tensor_digest(tensors, b"suffix")


def test_tensors_out_of_order_or_missing_are_refused() -> None:
    tensors = _tensors()
    with model_hash_behind(1, "") as hasher:
        hasher.add("b.bias", tensors["b.bias"])
        hasher.add("a.weight", tensors["a.weight"])  # queued; refused on the thread
        with pytest.raises(ValueError, match="'a.weight' does not sort after 'b.bias'"):
            hasher.result(sorted(tensors))
    with model_hash_behind(1, "") as hasher:
        hasher.add("a.weight", tensors["a.weight"])
        with pytest.raises(ValueError, match="covers 1 tensors, not the model's 4"):
            hasher.result(sorted(tensors))


def test_an_unsupported_dtype_raises_at_result_and_leaving_early_does_not() -> None:
    with model_hash_behind(1, "") as hasher:
        hasher.add("w", torch.zeros(3, dtype=torch.complex64))
        with pytest.raises(PayloadError, match="complex64"):
            hasher.result(["w"])
    with model_hash_behind(1, "") as hasher:  # a check that stopped early: nothing raised
        hasher.add("w", torch.zeros(3, dtype=torch.complex64))


def test_at_most_one_tensor_waits_to_be_hashed(monkeypatch: pytest.MonkeyPatch) -> None:
    real = hashing_thread()
    unfinished_at_submit: list[int] = []
    futures: list[Future[None]] = []

    class Counting:
        """The hashing thread, counting the jobs still unfinished when a new one comes."""

        def submit(self, fn: Callable[..., None], *args: object) -> Future[None]:
            unfinished_at_submit.append(sum(not f.done() for f in futures))
            futures.append(real.submit(fn, *args))
            return futures[-1]

    monkeypatch.setattr(hash_behind, "hashing_thread", lambda: Counting())
    # 8 MB tensors take milliseconds each to hash: an add that did not wait for the previous
    # one would find it still running.
    tensors = {f"t{i}": torch.ones(2_000_000) * i for i in range(4)}
    with model_hash_behind(1, "") as hasher:
        for name in sorted(tensors):
            hasher.add(name, tensors[name])
        got = hasher.result(sorted(tensors))
    assert unfinished_at_submit == [0, 0, 0, 0]
    assert got == model_hash(tensors, 1, "")


def test_the_check_hands_over_each_new_tensor_as_the_step_computes_it() -> None:
    g = torch.Generator().manual_seed(0)
    params = {f"t{i}": torch.randn(1000, generator=g) for i in range(4)}
    mean = {k: torch.randn(1000, generator=g) * 1e-2 for k in params}
    momentum = {k: torch.randn(1000, generator=g) for k in params}
    outer = OuterStep(lr=0.7, momentum=0.9, nesterov=True)
    with model_hash_behind(2, "sha256:p") as hasher:
        candidate = outer.candidate(params, mean, momentum)
        change, problem = precommit_problem(params, candidate, 10.0, on_checked=hasher.add)
        behind = hasher.result(sorted(params))
    assert problem is None and change is not None
    new_params, _ = outer.apply(params, mean, momentum)
    assert behind == model_hash(new_params, 2, "sha256:p")


def test_a_non_finite_model_stops_the_hand_over_at_the_bad_tensor() -> None:
    params = {"a": torch.ones(3), "b": torch.tensor([1.0, float("nan"), 0.0]), "c": torch.ones(2)}
    seen: list[str] = []
    change, problem = precommit_problem(
        {k: torch.zeros_like(v) for k, v in params.items()},
        params,
        10.0,
        on_checked=lambda name, _: seen.append(name),
    )
    assert change is None and problem is not None and "'b'" in problem
    assert seen == ["a"]
