"""Does federation pay off? A sweep of the main job's settings against honest baselines.

For every point (a set of ``--set`` overrides on top of the config), every participant count
``N`` and every seed (``run.root_seed``), trains in memory:

- the federated model (DiLoCo with the point's outer optimizer and its schedule, each update
  through the point's wire format, the coordinator's arithmetic:
  :class:`lensemble.simulation.baselines.DilocoRun`; :class:`Federation`), evaluated after
  every round, with the version ``federation.final_model: best_reported`` would keep;
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

Issue 39's grid (N x rounds x wire format x seeds, with its targets) is ``bench/payoff_grid.py``,
built on :class:`Federation` and :class:`Baselines`.

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
from lensemble.federation.keep_best import BestReported, final_choice, median_score
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


class Federation:
    """The config's federation, trained round by round in memory and scored after every round.

    DiLoCo with the config's outer optimizer and its schedule, each update through the config's
    wire format (:class:`DilocoRun`, the coordinator's arithmetic). Every version is scored on
    the union of the held-out episodes (``errors[v]``, version ``v`` after ``v`` rounds) and on
    each site's own (``reports[v]``: what each participant reports of the version it receives,
    the same k-step error), so the model ``federation.final_model: best_reported`` keeps is
    known without a second run. Nothing here reads ``federation.rounds``: the first ``R`` rounds
    of a longer run are an ``R``-round run.
    """

    def __init__(self, config: LensembleConfig, datasets: dict[str, ParticipantData]) -> None:
        opt = config.federation.outer_optimizer
        outer = OuterStep(lr=opt.lr, momentum=opt.momentum, nesterov=opt.nesterov)
        self.config, self.datasets = config, datasets
        self.run = DilocoRun(config, datasets, outer, scheduled=True)
        self.errors: list[float] = []
        self.reports: list[dict[str, float]] = []
        self._score(self.run.params)

    def _score(self, params: Any) -> None:
        report = evaluate(self.config, params, self.datasets)
        self.errors.append(report.union.k_step_error)
        self.reports.append({pid: s.k_step_error for pid, s in report.participants.items()})

    def advance(self, rounds: int) -> None:
        """Train and score the rounds not trained yet, up to ``rounds`` in all."""
        for r in range(len(self.errors), rounds + 1):
            self._score(self.run.train_until(r))

    def kept_version(self, rounds: int) -> int:
        """The version an ``rounds``-round run ends with under ``final_model: best_reported``.

        The coordinator's tracker (:class:`BestReported`, with ``federation.quorum``) scores
        version ``v`` by the median held-out report of round ``v``'s kept contributors.
        """
        tracker = BestReported(self.config.federation.quorum)
        for v in range(rounds):
            reports = {pid: self.reports[v][pid] for pid in self.run.contributors[v]}
            tracker.apply(tracker.score(v, f"v{v}", reports))
        return final_choice(tracker.state, rounds, f"v{rounds}").version

    def row(self, rounds: int) -> dict[str, Any]:
        """The federated fields of a JSON line for the first ``rounds`` rounds (advanced)."""
        curve = self.errors[1 : rounds + 1]
        kept = self.kept_version(rounds)
        quorum = self.config.federation.quorum
        reported = [
            median_score({p: self.reports[v][p] for p in self.run.contributors[v]}, quorum)[0]
            for v in range(rounds)
        ]
        return {
            "reported": reported,  # each version's median held-out report (the tracker's score)
            "federated": curve[-1],
            "federated_best_round": min(range(len(curve)), key=curve.__getitem__),  # 0-based
            "federated_best": min(curve),
            "curve": curve,
            "kept_version": kept,
            "final": {"last": curve[-1], "best_reported": self.errors[kept]},
        }


class Baselines:
    """Each site alone and the pooled oracle, trained incrementally and scored on demand."""

    def __init__(self, config: LensembleConfig, datasets: dict[str, ParticipantData]) -> None:
        steps = config.federation.inner_steps
        self.config, self.datasets = config, datasets
        self.local = {pid: LocalOnlyRun(config, pid, datasets[pid], steps) for pid in datasets}
        self.pooled = PooledRun(config, datasets)

    def scores(self, rounds: int) -> dict[str, float]:
        """``local:<id>`` and ``pooled`` union errors after ``rounds`` rounds."""
        out = {
            f"local:{pid}": union_error(self.config, run.train_until(rounds), self.datasets)
            for pid, run in self.local.items()
        }
        out["pooled"] = union_error(self.config, self.pooled.train_until(rounds), self.datasets)
        return out


def baseline_fields(scores: dict[str, float]) -> dict[str, Any]:
    """The baselines' fields of a JSON line, from :meth:`Baselines.scores`."""
    local = {k.split(":", 1)[1]: v for k, v in scores.items() if k.startswith("local:")}
    return {"local": local, "best_site": min(local.values()), "pooled": scores["pooled"]}


def run_point(
    config: LensembleConfig,
    overrides: list[str],
    cache: dict[str, dict[str, float]],
    fedavg: bool,
) -> dict[str, Any]:
    ids = config.participant_ids
    datasets = {pid: load_or_collect(config, pid) for pid in ids}
    rounds = config.federation.rounds
    start = time.perf_counter()
    federation = Federation(config, datasets)
    federation.advance(rounds)
    key = json.dumps(
        [
            config.run.root_seed,
            len(ids),
            *sorted(o for o in overrides if not o.startswith(_OUTER_ONLY)),
        ]
    )
    if key not in cache:
        cache[key] = Baselines(config, datasets).scores(rounds)
    row: dict[str, Any] = {**federation.row(rounds), **baseline_fields(cache[key])}
    if fedavg:
        row["fedavg"] = union_error(
            config,
            DilocoRun(config, datasets, FEDAVG, robust=False).train_until(rounds),
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
