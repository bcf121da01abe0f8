"""Issue 39's grid: does federation pay off over N sites x rounds x wire formats x seeds?

For every participant count ``N``, number of rounds ``R``, wire format (``federation.quantization``)
and seed (``run.root_seed``) this trains, with :mod:`federation_payoff`'s machinery (the
coordinator's arithmetic, in memory), the federation of the config, each site alone, the pooled
oracle and FedAvg (outer lr 1, no momentum, the same wire format), and scores them on the union
of every site's held-out episodes (normalised k-step latent error, lower is better). The final
model is scored under both ``federation.final_model`` policies from the same run: ``last`` and
``best_reported`` (the version with the lowest median held-out report, chosen by the
coordinator's own tracker from the reports the run computes).

Nothing trained depends on ``federation.rounds`` (without differential privacy, which the grid
refuses), so one run per ``(N, seed, wire)`` to the largest ``R`` gives every smaller ``R``
as its first rounds; each site alone and the pooled oracle do not depend on the wire format and
are trained once per ``(N, seed)`` (or read back from an earlier line of ``--out``, or of
another run's output named by ``--baselines``, as long as its ``--set`` touches only the
federation's settings).

One JSON line per ``(N, R, wire, seed)`` is appended to ``--out`` as soon as it is known; a
line already there is not trained again, so a stopped run resumes where it was (the key is
``(N, R, wire, seed)``: use one ``--out`` per config and ``--set``). ``--table``
reads the lines and prints, per cell and final-model policy, the ratios issue 39 asks for and
whether each target holds:

    nice -n 19 python bench/payoff_grid.py --participants 4,8 --rounds 20,30 \\
        --wire none,int8 --seeds 7,1,2 --out runs/payoff-grid.jsonl
    python bench/payoff_grid.py --table --out runs/payoff-grid.jsonl

Targets (issue 39): federated below the best site alone in every run; at most 1.25 x the
pooled oracle in every run; at most 1.01 x FedAvg in at least 4 of 5 runs (80% of the seeds
run); the final model within 2% of the best round's in every run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from federation_payoff import (  # bench/ is this script's folder
    REPO,
    Baselines,
    Federation,
    baseline_fields,
    union_error,
)

from lensemble.config import load_config
from lensemble.config.schema import LensembleConfig
from lensemble.data.trajectories import load_or_collect
from lensemble.simulation.baselines import FEDAVG, DilocoRun

WIRES = ("none", "fp16", "bf16", "int8")
POLICIES = ("last", "best_reported")
#: Issue 39's bounds: below the best site; pooled; FedAvg (and the share of seeds); best round.
POOLED_BOUND, FEDAVG_BOUND, FEDAVG_SHARE, BEST_ROUND_BOUND = 1.25, 1.01, 0.8, 1.02

Cell = tuple[int, int, str]  # (N, rounds, wire)


def key(row: dict[str, Any]) -> tuple[int, int, str, int]:
    """A line's ``(N, rounds, wire, seed)``."""
    return row["n"], row["rounds"], row["wire"], row["seed"]


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` (none when it does not exist; a torn last line is skipped)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a stopped run: it is trained again
    return rows


def config_for(
    path: str, extra: list[str], *, n: int, rounds: int, wire: str, seed: int, data: Path
) -> LensembleConfig:
    """The grid's config of one chain (quorum: a strict majority, as the default)."""
    config = load_config(
        path,
        [
            *extra,
            f"federation.participant_count={n}",
            "federation.quorum=0",
            f"federation.rounds={rounds}",
            f"federation.quantization={wire}",
            f"run.root_seed={seed}",
            f"run.output_dir={data}",
        ],
    )
    if any(p.privacy is not None for p in config.federation.participants):
        raise SystemExit(
            "payoff_grid: a participant's privacy plans its noise from federation.rounds, so "
            "shorter runs are not the first rounds of a longer one; drop the privacy settings."
        )
    return config


class SiteBaselines:
    """Each site alone and the pooled oracle of one ``(N, seed)``, by rounds.

    Read back from earlier lines of ``--out`` (any wire format: they do not depend on it),
    else trained once (incrementally) and kept for the other wire formats.
    """

    def __init__(self, rows: list[dict[str, Any]], n: int, seed: int) -> None:
        self.known = {
            r["rounds"]: {**{f"local:{p}": v for p, v in r["local"].items()}, "pooled": r["pooled"]}
            for r in rows
            if (r["n"], r["seed"]) == (n, seed)
        }
        self._runs: Baselines | None = None

    def scores(
        self, rounds: int, config: LensembleConfig, datasets: dict[str, Any]
    ) -> dict[str, float]:
        """:meth:`Baselines.scores` after ``rounds`` rounds."""
        if rounds not in self.known:
            if self._runs is None:
                self._runs = Baselines(config, datasets)
            self.known[rounds] = self._runs.scores(rounds)
        return self.known[rounds]


def chain(
    config: LensembleConfig, datasets: dict[str, Any], todo: list[int], sites: SiteBaselines
) -> Iterator[dict[str, Any]]:
    """The lines of one ``(N, seed, wire)``, one per ``todo`` (ascending rounds), in order."""
    start = last = time.perf_counter()
    federation = Federation(config, datasets)
    fedavg = DilocoRun(config, datasets, FEDAVG, robust=False)
    for rounds in todo:
        federation.advance(rounds)
        row = federation.row(rounds)
        row["fedavg"] = union_error(config, fedavg.train_until(rounds), datasets)
        row.update(baseline_fields(sites.scores(rounds, config, datasets)))
        now = time.perf_counter()
        row["seconds"] = round(now - last, 1)  # since the previous line of this chain
        row["chain_seconds"] = round(now - start, 1)
        last = now
        row["rounds"] = rounds
        yield row


def run_grid(args: argparse.Namespace) -> None:
    """Train every line of the grid not in ``--out`` yet, appending each as it is known."""
    rows = read_rows(args.out)
    done = {key(r) for r in rows}
    if args.out.exists() and not args.out.read_bytes().endswith(b"\n"):
        with args.out.open("a", encoding="utf-8") as f:
            f.write("\n")  # after a line cut short by a stopped run
    rounds_all = sorted(int(r) for r in args.rounds.split(","))
    borrowed = [row for path in args.baselines for row in read_rows(path)]
    with tempfile.TemporaryDirectory() as tmp:
        for seed in (int(s) for s in args.seeds.split(",")):
            for n in (int(c) for c in args.participants.split(",")):
                sites = SiteBaselines(rows + borrowed, n, seed)
                datasets: dict[str, Any] | None = None
                for wire in args.wire.split(","):
                    todo = [r for r in rounds_all if (n, r, wire, seed) not in done]
                    if not todo:
                        continue
                    data = Path(tmp) / f"data-{n}-{seed}"
                    config = config_for(
                        args.config, args.set, n=n, rounds=todo[-1], wire=wire, seed=seed, data=data
                    )
                    if datasets is None:
                        datasets = {p: load_or_collect(config, p) for p in config.participant_ids}
                    for row in chain(config, datasets, todo, sites):
                        row.update(n=n, wire=wire, seed=seed, set=args.set)
                        with args.out.open("a", encoding="utf-8") as f:
                            f.write(json.dumps(row, sort_keys=True) + "\n")
                        rows.append(row)
                        print(progress(row), flush=True)
    print(table(rows))


def progress(row: dict[str, Any]) -> str:
    return (
        f"N={row['n']} R={row['rounds']} wire={row['wire']} seed={row['seed']}: "
        f"federated {row['federated']:.4f} (best_reported v{row['kept_version']}: "
        f"{row['final']['best_reported']:.4f}; best round {row['federated_best']:.4f}) "
        f"best site {row['best_site']:.4f} pooled {row['pooled']:.4f} "
        f"FedAvg {row['fedavg']:.4f} [{row['seconds']} s]"
    )


def ratios(row: dict[str, Any], policy: str) -> dict[str, float]:
    """One line's ratios under a final-model policy (``last`` or ``best_reported``)."""
    final = row["final"][policy]
    return {
        "site": final / row["best_site"],
        "pooled": final / row["pooled"],
        "fedavg": final / row["fedavg"],
        "best_round": final / row["federated_best"],
    }


def verdicts(rs: list[dict[str, float]]) -> dict[str, Any]:
    """Issue 39's four targets over one cell's per-seed ratios (pass: True)."""
    within = sum(r["fedavg"] <= FEDAVG_BOUND for r in rs)
    return {
        "below_site": all(r["site"] < 1 for r in rs),
        "pooled": all(r["pooled"] <= POOLED_BOUND for r in rs),
        "fedavg": within >= FEDAVG_SHARE * len(rs),
        "fedavg_within": within,
        "best_round": all(r["best_round"] <= BEST_ROUND_BOUND for r in rs),
    }


def _cells(rows: Iterable[dict[str, Any]]) -> dict[Cell, list[dict[str, Any]]]:
    groups: dict[Cell, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["n"], r["rounds"], r["wire"]), []).append(r)
    order = {w: i for i, w in enumerate(WIRES)}
    return dict(sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], order[kv[0][2]])))


def table(rows: list[dict[str, Any]]) -> str:
    """The per-cell Markdown table: each ratio as mean (worst) over seeds, and the targets."""

    def fmt(rs: list[dict[str, float]], name: str) -> str:
        values = [r[name] for r in rs]
        return f"{statistics.fmean(values):.3f} ({max(values):.3f})"

    def mark(ok: bool) -> str:
        return "pass" if ok else "**FAIL**"

    lines = [
        "| N | rounds | wire | final model | seeds | fed / best site | fed / pooled "
        "| fed / FedAvg | final / best round | below best site, every run "
        "| <= 1.25x pooled, every run | <= 1.01x FedAvg, >= 80% of runs "
        "| final <= 1.02x best round, every run |",
        "|" + "---|" * 13,
    ]
    for (n, rounds, wire), group in _cells(rows).items():
        seeds = sorted({r["seed"] for r in group})
        for policy in POLICIES:
            rs = [ratios(r, policy) for r in group]
            v = verdicts(rs)
            lines.append(
                f"| {n} | {rounds} | {wire} | {policy} | {len(seeds)} "
                f"({','.join(map(str, seeds))}) | {fmt(rs, 'site')} | {fmt(rs, 'pooled')} "
                f"| {fmt(rs, 'fedavg')} | {fmt(rs, 'best_round')} | {mark(v['below_site'])} "
                f"| {mark(v['pooled'])} | {mark(v['fedavg'])} {v['fedavg_within']}/{len(rs)} "
                f"| {mark(v['best_round'])} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "config" / "local.yaml"))
    parser.add_argument("--participants", default="4,8,16", help="Comma-separated N.")
    parser.add_argument("--rounds", default="20,30,60", help="Comma-separated round counts.")
    parser.add_argument("--wire", default="none,bf16,int8", help="federation.quantization values.")
    parser.add_argument("--seeds", default="7,1,2,3,4", help="Comma-separated root seeds.")
    parser.add_argument(
        "--set", action="append", default=[], help="PATH=VALUE on top of the config (repeat)."
    )
    parser.add_argument("--out", type=Path, default=Path("runs/payoff-grid.jsonl"))
    parser.add_argument(
        "--baselines",
        type=Path,
        action="append",
        default=[],
        help="Another run's --out whose site-alone and pooled scores to reuse (repeat): they do "
        "not depend on --set's federation settings.",
    )
    parser.add_argument("--table", action="store_true", help="Print --out's table and stop.")
    args = parser.parse_args()
    unknown = set(args.wire.split(",")) - set(WIRES)
    if unknown:
        parser.error(f"--wire {','.join(sorted(unknown))}: use some of {','.join(WIRES)}")
    if args.table:
        print(table(read_rows(args.out)))
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    run_grid(args)


if __name__ == "__main__":
    main()
