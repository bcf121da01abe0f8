"""Attacks against the default defences: final union errors over seeds (docs/security.md).

For every participant count ``N`` (with ``f`` hostile: 1 of 4, 2 of 8, the first ``f`` ids in
sorted order) and every seed (``run.root_seed``), trains on ``config/local.yaml`` with the
shipped defaults, through the real coordinator, participants and in-process transport (the
ledger and checkpoints are written and verified):

- the clean run, and the clean run with the plain mean (no norm bound, no guard: the cost of
  the defences), and the run without the hostile participants (a perfect defence);
- every attack of :data:`ATTACKS` made by the ``f`` hostile participants on themselves
  (docs/attacks.md);
- each site alone (the local-only baseline).

Each federated model is scored on the union of every site's held-out episodes (``union``) and
on the union of the honest sites' only (``honest``: the hostile sites' data is what an honest
majority cannot vouch for); each site alone on both. One JSON line per (N, seed, run) goes to
``--out`` (appended: a stopped sweep continues where it stopped), and the table of final union
errors is printed at the end (and with ``--table-only``); ``--runs`` makes only the named runs:

    nice -n 10 python bench/attacks.py -n 4 -n 8 --seeds 1,2,3,4,7 --out runs/attacks.jsonl

One (N, seed) is 14 federated runs and N local-only ones: about 20 minutes on 2 busy cores for
N = 4 and 40 for N = 8.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lensemble.config import load_config
from lensemble.config.schema import LensembleConfig
from lensemble.data.trajectories import ParticipantData, load_or_collect
from lensemble.eval.heldout import evaluate
from lensemble.federation.coordinator import Coordinator, global_architecture
from lensemble.federation.faults import parse_faults
from lensemble.federation.guard import summary as divergence
from lensemble.federation.inprocess import InProcessTransport
from lensemble.federation.participant import Participant
from lensemble.federation.suspicion import Suspicion
from lensemble.federation.verify import verify_run
from lensemble.model.inner_loop import (
    LocalOnlyRun,
    WorldModelLearner,
    initial_global_parameters,
)

REPO = Path(__file__).resolve().parents[1]

#: Attack name -> its ``--faults`` entry, ``{H}`` standing for each hostile participant.
ATTACKS: dict[str, str] = {
    "scaled -9.5": "scaled:{H}@0-=-9.5",
    "ALIE": "alie:{H}@0-",
    "IPM 0.5": "ipm:{H}@0-=0.5",
    "IPM 4": "ipm:{H}@0-=4",
    "min-max": "minmax:{H}@0-",
    "min-sum": "minsum:{H}@0-",
    "sleeper (scaled -9.5 from round 10)": "scaled:{H}@10-=-9.5",
    "ALIE, omniscient": "alie_omniscient:{H}@0-",
    "IPM 4, omniscient": "ipm_omniscient:{H}@0-=4",
    "min-max, omniscient": "minmax_omniscient:{H}@0-",
    "min-sum, omniscient": "minsum_omniscient:{H}@0-",
}
#: A perfect defence: the hostile participants never contribute (what no defence can beat).
ORACLE = {"honest only (hostile dropped)": "drop:{H}@0-"}
#: The plain mean: no norm bound, no divergence guard, nobody set aside (what the defaults cost).
PLAIN = [
    "federation.robustness.median_factor=null",
    "federation.robustness.guard.enabled=false",
    "federation.robustness.set_aside_suspects=false",
]


def federated(
    config: LensembleConfig, datasets: dict[str, ParticipantData], spec: str, out: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One federated run (every round committed, the record verified); its final model's scores.

    Returns:
        ``(params, facts)``: the final parameters and the run's facts (rollbacks, suspects,
        and how many rounds each participant was set aside in).
    """
    theta0 = initial_global_parameters(config)
    arch = global_architecture(theta0)
    participants = {
        pid: Participant(config, pid, WorldModelLearner(config, pid, datasets[pid]), arch, out)
        for pid in config.participant_ids
    }
    coordinator = Coordinator(config, theta0, output_dir=out, signer=None)
    summary = coordinator.run(InProcessTransport(participants, parse_faults(spec)))
    report = verify_run(out, config.observability.ledger_path)
    if report.first_break is not None:
        raise RuntimeError(f"the run record does not verify: {report.first_break.sentence()}")
    guard = divergence(summary.records)
    last = summary.records[-1].defences.get("suspicion", {})
    facts = {
        "rollbacks": [r["round"] for r in guard["rollbacks"]],
        "suspects": guard["suspects"],
        "named": Suspicion().suspects(last),
        "set_aside": {
            pid: sum(pid in r.defences.get("set_aside", {}) for r in summary.records)
            for pid in sorted({p for r in summary.records for p in r.defences.get("set_aside", {})})
        },
        "suspicion": last,
        "warning": guard["warning"],
    }
    return summary.params, facts


def scores(
    config: LensembleConfig, params: Any, datasets: dict[str, ParticipantData], hostile: list[str]
) -> dict[str, float]:
    """Union k-step error on every site's held-out episodes and on the honest sites' only."""
    honest = {pid: d for pid, d in datasets.items() if pid not in hostile}
    return {
        "union": evaluate(config, params, datasets).union.k_step_error,
        "honest": evaluate(config, params, honest).union.k_step_error,
    }


def cell(
    n: int,
    seed: int,
    config_path: Path,
    data: Path,
    done: set[str],
    *,
    sets: list[str],
    only: set[str] | None = None,
    hostile_count: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Every run of one (N, seed) not in ``done``; yields their JSON rows as they finish.

    ``sets`` are ``--set`` overrides for every run (e.g. ``federation.aggregation=masking``);
    ``only``, when given, names the runs to make (``alone`` among them for the local-only ones);
    ``hostile_count`` overrides f (1 below N = 8, else 2).
    """
    base = [
        f"federation.participant_count={n}",
        "federation.quorum=0",
        f"run.root_seed={seed}",
        f"run.output_dir={data}",
        *sets,
    ]
    config = load_config(config_path, base)
    ids = sorted(config.participant_ids)
    hostile = ids[: (1 if n < 8 else 2) if hostile_count is None else hostile_count]
    datasets = {pid: load_or_collect(config, pid) for pid in ids}
    where = {"n": n, "seed": seed, "hostile": hostile, "sets": sets}
    runs = {"clean": "", "clean, plain mean": ""} | {
        name: ",".join(spec.format(H=h) for h in hostile)
        for name, spec in (ATTACKS | ORACLE).items()
    }
    for name, spec in runs.items():
        if name in done or (only is not None and name not in only):
            continue
        start = time.perf_counter()
        cfg = load_config(config_path, base + (PLAIN if name == "clean, plain mean" else []))
        with tempfile.TemporaryDirectory() as out:
            params, facts = federated(cfg, datasets, spec, Path(out))
        row = {"run": name, "faults": spec, **scores(cfg, params, datasets, hostile), **facts}
        row["seconds"] = round(time.perf_counter() - start, 1)
        print(f"N={n} seed={seed} {name}: {row['union']:.4f}, honest {row['honest']:.4f}")
        yield row | where
    if "alone" not in done and (only is None or "alone" in only):
        alone = {}
        for pid in ids:
            solo = LocalOnlyRun(config, pid, datasets[pid], config.federation.inner_steps)
            trained = solo.train_until(config.federation.rounds)
            alone[pid] = scores(config, trained, datasets, hostile)
        yield {"run": "alone", "sites": alone} | where


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per (N, run), the mean over seeds and the worst seed, against the references."""
    by = {(r["n"], r["seed"], r["run"]): r for r in rows}
    lines = []
    for n in sorted({r["n"] for r in rows}):
        seeds = sorted({r["seed"] for r in rows if r["n"] == n})
        alone = [by.get((n, s, "alone")) for s in seeds]
        if not all(alone):
            continue
        hostile = set(by[(n, seeds[0], "alone")]["hostile"])
        sites = {s: a["sites"] for s, a in zip(seeds, alone, strict=True) if a}
        best_all = {s: min(v["union"] for v in x.values()) for s, x in sites.items()}
        best_honest = {
            s: min(v["honest"] for p, v in x.items() if p not in hostile) for s, x in sites.items()
        }
        clean = {s: by[(n, s, "clean")] for s in seeds if (n, s, "clean") in by}
        lines += [
            f"\nN = {n}, f = {len(hostile)} ({', '.join(sorted(hostile))}), seeds "
            f"{', '.join(map(str, seeds))}; best site alone, mean over seeds: union "
            f"{statistics.fmean(best_all.values()):.4f}, honest union "
            f"{statistics.fmean(best_honest.values()):.4f}\n",
            "| run | union | honest union | worst union / clean | worst honest / clean "
            "| worst honest / best honest site alone | union < best site alone | rollbacks "
            "| named suspects |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        names = ["clean", "clean, plain mean", *ORACLE, *ATTACKS]
        for name in names:
            got = [by[(n, s, name)] for s in seeds if (n, s, name) in by and s in clean]
            if not got:
                continue
            worst_union = max(r["union"] / clean[r["seed"]]["union"] for r in got)
            worst = max(r["honest"] / clean[r["seed"]]["honest"] for r in got)
            worst_alone = max(r["honest"] / best_honest[r["seed"]] for r in got)
            beat_u = sum(r["union"] < best_all[r["seed"]] for r in got)
            rolled = sum(len(r["rollbacks"]) for r in got)
            named = sorted(
                {p for r in got for p in r["suspects"]}
                | {p for r in got for p in r.get("named", [])}
            )
            lines.append(
                f"| {name} | {statistics.fmean(r['union'] for r in got):.4f} "
                f"| {statistics.fmean(r['honest'] for r in got):.4f} | {worst_union:.2f} "
                f"| {worst:.2f} "
                f"| {worst_alone:.2f} | {beat_u}/{len(got)} | {rolled} "
                f"| {', '.join(named) or '-'} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "config" / "local.yaml")
    parser.add_argument("-n", dest="counts", type=int, action="append", default=[])
    parser.add_argument("--seeds", default="7", help="Comma-separated root seeds.")
    parser.add_argument("--out", type=Path, default=Path("runs/attacks.jsonl"))
    parser.add_argument("--table-only", action="store_true", help="Summarise --out and stop.")
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        help="A config override for every run, e.g. federation.aggregation=masking (repeatable).",
    )
    parser.add_argument(
        "--runs",
        default=None,
        help="Semicolon-separated run names to make (e.g. 'clean;scaled -9.5;alone'); all "
        "when omitted.",
    )
    parser.add_argument(
        "--hostile",
        type=int,
        default=None,
        help="f, the hostile participants of every N (default 1 below N = 8, else 2); keep "
        "each f in its own --out file.",
    )
    args = parser.parse_args()
    only = None if args.runs is None else {r.strip() for r in args.runs.split(";") if r.strip()}
    known = {"clean", "clean, plain mean", "alone", *ORACLE, *ATTACKS}
    if only is not None and not only <= known:
        parser.error(f"--runs names unknown runs {sorted(only - known)}; known: {sorted(known)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(x) for x in args.out.read_text().splitlines()] if args.out.exists() else []
    if not args.table_only:
        with tempfile.TemporaryDirectory() as data:
            for n in args.counts or [4]:
                for seed in (int(s) for s in args.seeds.split(",")):
                    done = {r["run"] for r in rows if (r["n"], r["seed"]) == (n, seed)}
                    folder = Path(data) / f"{n}-{seed}"
                    for row in cell(
                        n,
                        seed,
                        args.config,
                        folder,
                        done,
                        sets=args.sets,
                        only=only,
                        hostile_count=args.hostile,
                    ):
                        with args.out.open("a", encoding="utf-8") as f:
                            f.write(json.dumps(row, sort_keys=True) + "\n")
                        rows.append(row)
    print(table(rows))


if __name__ == "__main__":
    main()
