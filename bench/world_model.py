"""The world model's share of the main job: data, inner steps, evaluation, DiLoCo vs local-only.

Measures, on ``config/local.yaml`` (or CONFIG) with a fresh output folder:

- data collection for every participant (cold) and reading it back from the cache (warm);
- one ``train_round`` of ``federation.inner_steps`` steps, single-threaded (what the learner
  does) and with torch's default thread count (to show which is faster);
- one held-out evaluation of the global model on every participant's data;
- a small DiLoCo loop (outer Nesterov SGD on the mean pseudo-gradient, canonical order, fp32)
  for ``federation.rounds`` rounds, and the local-only baseline of every participant, then the
  held-out k-step error and probe R^2 on the union of held-out data.

    python bench/world_model.py [CONFIG] [--set path=value ...]

The DiLoCo loop here only tunes the model; the real one is the federation runtime's.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from lensemble.config import load_config
from lensemble.config.schema import LensembleConfig
from lensemble.data.trajectories import ParticipantData, load_or_collect
from lensemble.eval.heldout import EvalReport, evaluate
from lensemble.model import inner_loop as learner_module
from lensemble.model.inner_loop import (
    WorldModelLearner,
    initial_global_parameters,
    train_local_only,
)

REPO = Path(__file__).resolve().parents[1]
Params = dict[str, torch.Tensor]


def timed(fn, repeat: int = 1):  # type: ignore[no-untyped-def]
    samples, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), result


@contextlib.contextmanager
def default_threads() -> Iterator[None]:
    """Let the learner use torch's default thread count (bench only)."""
    original = learner_module.single_threaded
    learner_module.single_threaded = contextlib.nullcontext  # type: ignore[assignment]
    try:
        yield
    finally:
        learner_module.single_threaded = original


def diloco(
    config: LensembleConfig, datasets: dict[str, ParticipantData], global_params: Params
) -> tuple[Params, list[float]]:
    """DiLoCo (arXiv 2311.08105): inner AdamW per participant, outer Nesterov SGD."""
    fed = config.federation
    ids = sorted(datasets)
    learners = {pid: WorldModelLearner(config, pid, datasets[pid]) for pid in ids}
    theta = {k: v.float().clone() for k, v in global_params.items()}
    momentum = {k: torch.zeros_like(v) for k, v in theta.items()}
    lr, mu = fed.outer_optimizer.lr, fed.outer_optimizer.momentum
    losses = []
    for r in range(fed.rounds):
        results = [learners[pid].train_round(theta, r, fed.inner_steps) for pid in ids]
        losses.append(sum(res.mean_loss for res in results) / len(results))
        for name, value in theta.items():
            mean_delta = torch.zeros_like(value)
            for res in results:  # canonical (sorted) order, fp32
                mean_delta += value - res.params[name].float()
            mean_delta /= len(results)
            momentum[name] = mu * momentum[name] + mean_delta
            theta[name] = value - lr * (mean_delta + mu * momentum[name])
    return theta, losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(REPO / "config" / "local.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        config = load_config(args.config, [*args.overrides, f"run.output_dir={tmp}"])
        fed = config.federation
        ids = config.participant_ids
        job_start = time.perf_counter()

        # The main job's share, in the order the runtime runs it.
        cold, datasets = timed(lambda: {pid: load_or_collect(config, pid) for pid in ids})
        theta0 = initial_global_parameters(config)
        fed_s, (theta, losses) = timed(lambda: diloco(config, datasets, theta0))
        local_s, local = timed(
            lambda: {
                pid: train_local_only(config, pid, datasets[pid], fed.rounds, fed.inner_steps)
                for pid in ids
            }
        )
        eval_fed: EvalReport = evaluate(config, theta, datasets)
        eval_init = evaluate(config, theta0, datasets)
        eval_local = {pid: evaluate(config, local[pid], datasets) for pid in ids}
        job = time.perf_counter() - job_start
        rows += [
            (f"data collection, {len(ids)} participants (cold)", f"{cold:.3f} s"),
            (
                f"DiLoCo, {fed.rounds} rounds x {fed.inner_steps} steps x {len(ids)}",
                f"{fed_s:.2f} s",
            ),
            (f"local-only, {len(ids)} x {fed.rounds * fed.inner_steps} steps", f"{local_s:.2f} s"),
            ("all of the above + evaluations (one process)", f"{job:.2f} s"),
        ]

        # Single operations (median of several).
        warm, _ = timed(lambda: {pid: load_or_collect(config, pid) for pid in ids}, repeat=3)
        rows.append((f"data from cache, {len(ids)} participants (warm)", f"{warm:.3f} s"))
        n_params = sum(v.numel() for v in theta0.values())
        one = WorldModelLearner(config, ids[0], datasets[ids[0]])
        one.train_round(theta0, 0, fed.inner_steps)  # warm-up
        single, _ = timed(lambda: one.train_round(theta0, 1, fed.inner_steps), repeat=5)
        rows.append((f"train_round, {fed.inner_steps} steps, 1 thread", f"{single * 1000:.1f} ms"))
        sig_config = load_config(
            args.config,
            [*args.overrides, f"run.output_dir={tmp}", "model.regularizer=sigreg"],
        )
        sig = WorldModelLearner(sig_config, ids[0], datasets[ids[0]])
        sig.train_round(theta0, 0, fed.inner_steps)  # warm-up
        sig_s, _ = timed(lambda: sig.train_round(theta0, 1, fed.inner_steps), repeat=5)
        rows.append(
            (f"train_round, {fed.inner_steps} steps, sigreg, 1 thread", f"{sig_s * 1000:.1f} ms")
        )
        eval_s, _ = timed(lambda: evaluate(config, theta0, datasets), repeat=5)
        rows.append((f"evaluate, {len(ids)} participants + union", f"{eval_s * 1000:.1f} ms"))
        # Last: an OpenMP pool of several threads keeps spinning after use and would slow
        # whatever is measured next.
        with default_threads():
            threads = torch.get_num_threads()
            multi, _ = timed(lambda: one.train_round(theta0, 1, fed.inner_steps), repeat=3)
        rows.append(
            (f"train_round, {fed.inner_steps} steps, {threads} threads", f"{multi * 1000:.1f} ms")
        )

    width = max(len(k) for k, _ in rows)
    print(f"world model: {n_params} parameters, torch {torch.__version__}")
    print(f"{'measurement':<{width}}  value")
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print(f"\nmean inner loss: round 1 {losses[0]:.4f} -> round {len(losses)} {losses[-1]:.4f}")
    k = config.evaluation.k_steps
    print(f"\nheld-out {k}-step error (normalised) and probe R^2 on the union of held-out data")
    print(f"{'model':<22} {'union error':>12} {'union R^2':>10}")
    print(
        f"{'federated (DiLoCo)':<22} {eval_fed.union.k_step_error:>12.4f} "
        f"{eval_fed.union.probe_r2:>10.4f}"
    )
    print(
        f"{'untrained (theta_0)':<22} {eval_init.union.k_step_error:>12.4f} "
        f"{eval_init.union.probe_r2:>10.4f}"
    )
    for pid in ids:
        u = eval_local[pid].union
        print(f"{'local-only ' + pid:<22} {u.k_step_error:>12.4f} {u.probe_r2:>10.4f}")
    mean_err = statistics.fmean(eval_local[p].union.k_step_error for p in ids)
    mean_r2 = statistics.fmean(eval_local[p].union.probe_r2 for p in ids)
    print(f"{'mean local-only':<22} {mean_err:>12.4f} {mean_r2:>10.4f}")
    ratio = eval_fed.union.k_step_error / mean_err
    print(f"\nfederated / mean local-only error: {ratio:.3f}")
    print("\nper participant (own held-out data): federated vs its local-only model")
    for pid in ids:
        f, lo = eval_fed.participants[pid], eval_local[pid].participants[pid]
        print(
            f"  {pid:<10} error {f.k_step_error:.4f} vs {lo.k_step_error:.4f}   "
            f"R^2 {f.probe_r2:.4f} vs {lo.probe_r2:.4f}"
        )


if __name__ == "__main__":
    main()
