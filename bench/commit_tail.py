"""The coordinator's commit tail: pre-commit check, outer step and new model hash.

Times, on float32 parameters in 8 tensors with torch on one thread (as the network
coordinator runs), the two ways of reaching a committed model hash after the reduction:

- **serial**: ``precommit_problem`` over ``OuterStep.candidate``, ``OuterStep.apply_in_place``,
  then ``model_hash`` over the new parameters (the coordinator before the hash moved behind);
- **behind**: the same check handing each checked tensor to
  :func:`~lensemble.federation.payload.model_hash_behind`, the same step, then its result
  (what ``Coordinator.run_attempt`` does).

Both give the same hash, which the bench checks. Reported: the median seconds of ``--repeats``
interleaved calls per size (wall clock: the point is the second core).

    nice -n 19 python bench/commit_tail.py [--params 1M,100M] [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from network_transport import parse_count  # bench/ is this script's folder

from lensemble.federation.diloco import OuterStep
from lensemble.federation.payload import model_hash, model_hash_behind
from lensemble.federation.robustness import precommit_problem
from lensemble.machinery.flat import flat_copy

TENSORS = 8
OUTER = OuterStep(lr=0.7, momentum=0.9, nesterov=True)
LIMIT = 10.0  # max_relative_change: never reached here


def state(total: int) -> tuple[dict[str, torch.Tensor], ...]:
    """Parameters, mean pseudo-gradient and momentum: ``total`` float32 values each."""
    g = torch.Generator().manual_seed(0)
    size = total // TENSORS
    params = flat_copy({f"t{i}": torch.randn(size, generator=g) for i in range(TENSORS)})
    mean = {k: torch.randn(size, generator=g) * 1e-3 for k in params}
    momentum = flat_copy({k: torch.randn(size, generator=g) * 1e-2 for k in params})
    return params, mean, momentum


def serial(
    params: dict[str, torch.Tensor], mean: dict[str, torch.Tensor], m: dict[str, torch.Tensor]
) -> str:
    """The coordinator's tail before: check, step, then hash; returns the new model's hash."""
    candidate = OUTER.candidate(params, mean, m)
    _, problem = precommit_problem(params, candidate, LIMIT)
    assert problem is None
    OUTER.apply_in_place(params, mean, m)
    return model_hash(params, 1, "")


def behind(
    params: dict[str, torch.Tensor], mean: dict[str, torch.Tensor], m: dict[str, torch.Tensor]
) -> str:
    """The coordinator's tail now: the hash beside the check and the step; returns it."""
    with model_hash_behind(1, "") as hasher:
        candidate = OUTER.candidate(params, mean, m)
        _, problem = precommit_problem(params, candidate, LIMIT, on_checked=hasher.add)
        assert problem is None
        OUTER.apply_in_place(params, mean, m)
        return hasher.result(sorted(params))


def main() -> None:
    """Time both ways per size and print one line each."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="1M,100M", help="sizes, e.g. 1M,10M,100M")
    parser.add_argument("--repeats", type=int, default=20, help="calls per way (interleaved)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'params':>8} {'serial s':>10} {'behind s':>10} {'behind/serial':>14}")
    for label in args.params.split(","):
        total = parse_count(label)
        # Each way steps its own copy, so both start every call from the same state.
        ways = {"serial": (serial, state(total)), "behind": (behind, state(total))}
        times: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.repeats):
            hashes = set()
            for name, (fn, (params, mean, momentum)) in ways.items():
                start = time.perf_counter()
                hashes.add(fn(params, mean, momentum))
                times[name].append(time.perf_counter() - start)
            assert len(hashes) == 1, "the two ways disagree on the new model's hash"
        s, b = (statistics.median(times[name]) for name in ("serial", "behind"))
        print(f"{label:>8} {s:>10.4f} {b:>10.4f} {b / s:>14.2f}")


if __name__ == "__main__":
    main()
