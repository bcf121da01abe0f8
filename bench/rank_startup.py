"""What a 2-rank in-process participant costs next to a 1-rank one, and where the time goes.

Runs the in-process simulation (:func:`lensemble.simulation.in_process.run_in_process`) of
``config/local.yaml`` for 2 rounds (``--preset local``: 4 participants, the evaluation and every
baseline included, as ``lensemble simulate -r 2`` runs it) or of a small config (``--preset
small``: 2 participants, 4 inner steps, a small model, no baselines) three ways, each in a
fresh interpreter so that nothing is warm: every participant on 1 rank; every
participant on 2 ranks started by ``spawn`` (the runtime before issue 41); and on 2 ranks
started from the fork server (``lensemble.ranks.launch.START_METHOD``, the runtime now). Per
way it prints the run's wall time, and per rank-group launch its wall time and the inner
steps' share of it (``RankGroupLearner.launch_seconds`` against the round's compute seconds);
the rest is start-up: interpreters, imports, rendezvous, ``init_process_group``, state
broadcast and gather.

Data collection is done before the clock starts (it is the same for every way).

    nice -n 19 python bench/rank_startup.py [--preset local|small] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SMALL = [
    "federation.quorum=1",
    "federation.inner_steps=4",
    "federation.round_timeout_s=300",
    "federation.join_timeout_s=300",
    "data.episodes=8",
    "data.episode_steps=40",
    "data.window=4",
    "evaluation.k_steps=3",
    "evaluation.local_only_baseline=false",
    "evaluation.pooled_oracle=false",
    "evaluation.fedavg_ablation=false",
    "model.hidden_dim=32",
    "model.latent_dim=8",
]


def one_way(ranks: int, start_method: str, rounds: int, preset: str, out: Path) -> dict:
    """Run the simulation once in this process; return its timings."""
    from lensemble.config import load_config
    from lensemble.ranks import launch
    from lensemble.ranks import learner as rank_learner
    from lensemble.simulation.in_process import run_in_process

    launch.START_METHOD = start_method
    launches: list[tuple[float, float]] = []
    train_round = rank_learner.RankGroupLearner.train_round

    def timed(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        result = train_round(self, *args, **kwargs)
        launches.append((self.launch_seconds, result.compute_seconds))
        return result

    rank_learner.RankGroupLearner.train_round = timed  # type: ignore[method-assign]
    overrides = [
        *(SMALL if preset == "small" else []),
        *(["federation.participant_count=2"] if preset == "small" else []),
        f"federation.rounds={rounds}",
        f"federation.ranks.processes_per_node={ranks}",
        f"run.output_dir={out}",
    ]
    config = load_config(REPO / "config" / "local.yaml", overrides)
    # Data collection is the same for every way: do it before the clock starts.
    from lensemble.data.trajectories import load_or_collect

    for pid in config.participant_ids:
        load_or_collect(config, pid)
    start = time.perf_counter()
    result = run_in_process(config)
    wall = time.perf_counter() - start
    return {
        "ranks": ranks,
        "start": start_method if ranks > 1 else "-",
        "wall_s": round(wall, 1),
        "model_hash": result.model_hash,
        "launches": [[round(a, 2), round(b, 2)] for a, b in launches],
    }


def main() -> None:
    """Run every way in its own interpreter and print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--preset", choices=("local", "small"), default="local")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: ranks,start,out
    args = parser.parse_args()
    if args.one:
        ranks, start, out = args.one.split(",")
        print(json.dumps(one_way(int(ranks), start, args.rounds, args.preset, Path(out))))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ranks, start in ((1, "spawn"), (2, "spawn"), (2, "forkserver")):
            out = Path(tmp) / f"r{ranks}-{start}"
            spec = f"{ranks},{start},{out}"
            proc = subprocess.run(
                [sys.executable, __file__, "--one", spec, "--rounds", str(args.rounds),
                 "--preset", args.preset],
                capture_output=True, text=True, check=True, env={**os.environ},
            )  # fmt: skip
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    load = os.getloadavg()[0]
    print(f"preset {args.preset}, {args.rounds} rounds; load average {load:.1f} at the end")
    print("| ranks | start | wall s | launches (wall s / inner steps s) | model hash |")
    print("|---|---|---|---|---|")
    for row in rows:
        launches = ", ".join(f"{a} / {b}" for a, b in row["launches"]) or "-"
        print(
            f"| {row['ranks']} | {row['start']} | {row['wall_s']} | {launches} | "
            f"{row['model_hash'][:19]}... |"
        )


if __name__ == "__main__":
    main()
