"""Does federation pay off? A sweep of the main job's settings against honest baselines.

For every point (a set of ``--set`` overrides on top of the config), every participant count
``N`` and every seed (``run.root_seed``), trains in memory:

- the federated model (DiLoCo with the point's outer optimizer, the coordinator's arithmetic:
  :class:`lensemble.simulation.baselines.DilocoRun`), evaluated after every round;
- each participant alone (the local-only baseline) and the best of them;
- the pooled-data oracle (one model on every participant's training data, ``N * H`` steps a
  round);
- optionally FedAvg (outer lr 1, no momentum; ``--fedavg``);

and scores each on the union of every participant's held-out episodes (normalised k-step latent
error, lower is better). Baselines that a point does not change (it changes only the outer
optimizer) are trained once, and kept in ``<out>.baselines.json`` for later invocations.

One JSON line per (point, N, seed) goes to ``--out`` (appended, so a sweep can be stopped and
continued); at the end a table per point and N gives the mean over seeds of the federated, best
single site and oracle errors, how many seeds the federation beat the best site in, the worst
ratios federated / best site and federated / oracle, and the worst ratio final / best round
(late degradation).

    nice -n 19 python bench/federation_payoff.py -n 4 -n 8 --seeds 1,2 \\
        --point default: --point h50:federation.inner_steps=50 --out runs/payoff.jsonl

A point is ``NAME:PATH=VALUE,PATH=VALUE`` (``NAME:`` alone is the config as it is). Run it under
``nice -n 19`` on a shared machine: one point for one seed is 3 x (N x H x R) inner steps
(4 with ``--fedavg``), baselines already trained excepted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from lensemble.config import load_config
from lensemble.config.schema import LensembleConfig
from lensemble.data.trajectories import ParticipantData, load_or_collect
from lensemble.eval.heldout import evaluate
from lensemble.federation.diloco import OuterStep
from lensemble.model.inner_loop import LocalOnlyRun
from lensemble.simulation.baselines import FEDAVG, DilocoRun, PooledRun

REPO = Path(__file__).resolve().parents[1]

# Settings that do not change the local-only and pooled baselines (their cache key omits them).
_OUTER_ONLY = ("federation.outer_optimizer.",)


def union_error(
    config: LensembleConfig, params: Any, datasets: dict[str, ParticipantData]
) -> float:
    return evaluate(config, params, datasets).union.k_step_error


def parse_point(text: str) -> tuple[str, list[str]]:
    name, _, rest = text.partition(":")
    return name, [item for item in rest.split(",") if item]


def run_point(
    config: LensembleConfig,
    overrides: list[str],
    cache: dict[str, dict[str, float]],
    fedavg: bool,
) -> dict[str, Any]:
    ids = config.participant_ids
    datasets = {pid: load_or_collect(config, pid) for pid in ids}
    fed = config.federation
    start = time.perf_counter()
    outer = OuterStep(
        lr=fed.outer_optimizer.lr,
        momentum=fed.outer_optimizer.momentum,
        nesterov=fed.outer_optimizer.nesterov,
    )
    run = DilocoRun(config, datasets, outer)
    curve = [union_error(config, run.train_until(r), datasets) for r in range(1, fed.rounds + 1)]
    key = json.dumps(
        [
            config.run.root_seed,
            len(ids),
            *sorted(o for o in overrides if not o.startswith(_OUTER_ONLY)),
        ]
    )
    if key not in cache:
        local = {
            pid: union_error(
                config,
                LocalOnlyRun(config, pid, datasets[pid], fed.inner_steps).train_until(fed.rounds),
                datasets,
            )
            for pid in ids
        }
        pooled = union_error(config, PooledRun(config, datasets).train_until(fed.rounds), datasets)
        cache[key] = {**{f"local:{p}": v for p, v in local.items()}, "pooled": pooled}
    base = cache[key]
    local = {k.split(":", 1)[1]: v for k, v in base.items() if k.startswith("local:")}
    row: dict[str, Any] = {
        "federated": curve[-1],
        "federated_best_round": min(range(len(curve)), key=curve.__getitem__),  # 0-based
        "federated_best": min(curve),
        "curve": curve,
        "local": local,
        "best_site": min(local.values()),
        "pooled": base["pooled"],
    }
    if fedavg:
        row["fedavg"] = union_error(
            config,
            DilocoRun(config, datasets, FEDAVG, robust=False).train_until(fed.rounds),
            datasets,
        )
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["point"], r["n"]), []).append(r)
    head = (
        "| point | N | seeds | federated | best site | pooled oracle | fed < best site "
        "| worst fed / best site | worst fed / oracle | worst final / best round |"
    )
    lines = [head, "|" + "---|" * 10]
    for (point, n), rs in groups.items():
        mean = statistics.fmean
        wins = sum(r["federated"] < r["best_site"] for r in rs)
        lines.append(
            f"| {point} | {n} | {len(rs)} | {mean(r['federated'] for r in rs):.4f} "
            f"| {mean(r['best_site'] for r in rs):.4f} | {mean(r['pooled'] for r in rs):.4f} "
            f"| {wins}/{len(rs)} | {max(r['federated'] / r['best_site'] for r in rs):.3f} "
            f"| {max(r['federated'] / r['pooled'] for r in rs):.2f} "
            f"| {max(r['federated'] / r['federated_best'] for r in rs):.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "config" / "local.yaml"))
    parser.add_argument("-n", dest="counts", type=int, action="append", default=[])
    parser.add_argument("--seeds", default="7", help="Comma-separated root seeds.")
    parser.add_argument("--point", action="append", default=[], help="NAME:PATH=VALUE,...")
    parser.add_argument("--fedavg", action="store_true", help="Also train the FedAvg ablation.")
    parser.add_argument("--out", type=Path, default=Path("runs/federation_payoff.jsonl"))
    parser.add_argument("--table-only", action="store_true", help="Summarise --out and stop.")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = (
        [json.loads(line) for line in args.out.read_text().splitlines()]
        if args.out.exists()
        else []
    )
    if not args.table_only:
        seen = {(r["point"], r["n"], r["seed"]) for r in done}
        # Baselines persist next to --out, so that a later invocation reuses them.
        cache_file = args.out.with_suffix(".baselines.json")
        cache: dict[str, dict[str, float]] = (
            json.loads(cache_file.read_text()) if cache_file.exists() else {}
        )
        with tempfile.TemporaryDirectory() as tmp:
            for point in args.point or ["default:"]:
                name, overrides = parse_point(point)
                for n in args.counts or [4]:
                    for seed in (int(s) for s in args.seeds.split(",")):
                        if (name, n, seed) in seen:
                            continue
                        config = load_config(
                            args.config,
                            [
                                *overrides,
                                f"federation.participant_count={n}",
                                "federation.quorum=0",
                                f"run.root_seed={seed}",
                                f"run.output_dir={tmp}/data-{n}-{seed}",
                            ],
                        )
                        row = run_point(config, overrides, cache, args.fedavg)
                        cache_file.write_text(json.dumps(cache, sort_keys=True))
                        row.update(point=name, overrides=overrides, n=n, seed=seed)
                        with args.out.open("a", encoding="utf-8") as f:
                            f.write(json.dumps(row, sort_keys=True) + "\n")
                        done.append(row)
                        extra = f" fedavg {row['fedavg']:.4f}" if "fedavg" in row else ""
                        print(
                            f"{name} N={n} seed={seed}: federated {row['federated']:.4f} "
                            f"(best round {row['federated_best_round']}: "
                            f"{row['federated_best']:.4f}) best site {row['best_site']:.4f} "
                            f"pooled {row['pooled']:.4f}{extra} [{row['seconds']} s]",
                            flush=True,
                        )
    print(table(done))


if __name__ == "__main__":
    main()
