"""Per-round cost of the coordinator's defences against poisoned updates, relative to the mean.

At 10M float32 parameters (ten 1M-element tensors) and N = 16 participants, one run measures
(median of ``--repeat`` runs each, milliseconds, and as a ratio to the plain canonical mean):

- ``mean``: :func:`~lensemble.federation.diloco.canonical_mean`, the reduction without defences;
- ``norms``: the L2 norm of every update (float64, ``robustness.update_norm``);
- ``screen (no clip)``: norms plus the bound, no update above it (an honest round);
- ``screen (1 clipped)``: the same with one update 1e4 times too large, scaled down;
- ``trimmed mean``, ``median``: the coordinate-wise aggregators (sorting N values per coordinate);
- ``pre-commit``: the finiteness and relative-change check of the new model.

A round with defences costs ``screen + aggregator + pre-commit`` where it used to cost ``mean``.

    nice -n 19 python bench/defenses.py               # 10M, N = 16
    nice -n 19 python bench/defenses.py --params 1000000 --n 4
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from lensemble.config.schema import RobustnessConfig
from lensemble.federation.diloco import canonical_mean
from lensemble.federation.robustness import (
    coordinate_median,
    coordinate_trimmed_mean,
    precommit_problem,
    screen,
    update_norm,
)

TENSOR = 1 << 20


def make_update(total: int, seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """A pseudo-gradient of ``total`` float32 parameters in 1M-element tensors."""
    g = torch.Generator().manual_seed(seed)
    out, left, i = {}, total, 0
    while left > 0:
        n = min(TENSOR, left)
        out[f"layer.{i:04d}.weight"] = torch.randn(n, generator=g) * scale
        left, i = left - n, i + 1
    return out


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``fn`` in milliseconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=10_000_000, help="parameters (count)")
    parser.add_argument("--n", type=int, default=16, help="participants (count)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement")
    args = parser.parse_args()

    honest = {f"p{i:02d}": make_update(args.params, i, 0.01) for i in range(args.n)}
    poisoned = dict(honest, p00=make_update(args.params, 0, 100.0))
    model = make_update(args.params, 999)
    new_model = {k: v - 0.7 * honest["p01"][k] for k, v in model.items()}
    config = RobustnessConfig()
    cases: list[tuple[str, Callable[[], object]]] = [
        ("mean", lambda: canonical_mean(honest)),
        ("norms", lambda: [update_norm(d) for d in honest.values()]),
        ("screen (no clip)", lambda: screen(honest, config)),
        ("screen (1 clipped)", lambda: screen(poisoned, config)),
        ("trimmed mean", lambda: coordinate_trimmed_mean(honest, config.trim_fraction)),
        ("median", lambda: coordinate_median(honest)),
        ("pre-commit", lambda: precommit_problem(model, new_model, config.max_relative_change)),
    ]
    threads = torch.get_num_threads()
    print(f"defences at {args.params:,} parameters, N = {args.n}, torch threads {threads}")
    print(f"{'step':<20} {'ms':>10} {'x mean':>8}")
    base = None
    for name, fn in cases:
        ms = timed(fn, args.repeat)
        base = base if base is not None else ms
        print(f"{name:<20} {ms:>10.1f} {ms / base:>8.2f}")


if __name__ == "__main__":
    main()
