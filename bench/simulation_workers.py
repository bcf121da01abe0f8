"""`lensemble simulate` in process (worker processes, or one process) against the network transport.

Runs ``lensemble simulate CONFIG --json`` for each mode and model size, interleaved
(repetition by repetition), each into a fresh output folder, and prints per cell the median of
each run's round times (the ledger's ``wall_s`` of the committed rounds after the first, which
holds the workers' and processes' start-up), the whole command's wall time and the committed
model hash (every mode of one size must commit the same one).

Modes:

- ``workers``: in process, the default: learners and baselines in worker processes, one per
  core (``--workers`` unset);
- ``serial``: in process, ``--workers 1``: everything in the simulation's own process;
- ``network``: ``--set federation.transport=network``: coordinator and participants as
  processes on loopback with mTLS.

    python bench/simulation_workers.py --sizes 64:20,256:5,512:5 --repeat 2 --out runs/sim.jsonl

A size is ``HIDDEN_DIM:ROUNDS`` (``model.hidden_dim`` and ``federation.rounds``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MODES = {
    "workers": [],
    "serial": ["--workers", "1"],
    "network": ["--set", "federation.transport=network"],
}


def run_once(config: Path, mode: str, hidden: int, rounds: int, extra: list[str]) -> dict:
    """One ``lensemble simulate`` run; its round times, wall time and hash."""
    with tempfile.TemporaryDirectory(prefix="sim-bench-") as folder:
        command = [
            sys.executable,
            "-c",
            "from lensemble.cli import main; main()",
            "simulate",
            str(config),
            "--json",
            "-o",
            folder,
            "--set",
            f"model.hidden_dim={hidden}",
            "--set",
            f"federation.rounds={rounds}",
            *MODES[mode],
            *extra,
        ]
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{mode} failed ({done.returncode}): {done.stderr[-2000:]}")
        text = (Path(folder) / "ledger.jsonl").read_text()
        lines = [json.loads(line)["record"] for line in text.splitlines()]
    rounds_s = [r["wall_s"] for r in lines if r["model_hash"] != r["parent_hash"]][1:]
    return {
        "mode": mode,
        "hidden_dim": hidden,
        "rounds": rounds,
        "round_s": statistics.median(rounds_s),
        "wall_s": round(wall, 2),
        "model_hash": lines[-1]["model_hash"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", type=Path, default=REPO / "config" / "local.yaml")
    parser.add_argument("--sizes", default="64:20,256:5,512:5", help="HIDDEN_DIM:ROUNDS,...")
    parser.add_argument("--modes", default=",".join(MODES), help="of: " + ", ".join(MODES))
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], help="more config overrides")
    parser.add_argument("--out", type=Path, help="append each run as a JSON line")
    args = parser.parse_args()
    extra = [item for value in args.set for item in ("--set", value)]
    rows = []
    for size in args.sizes.split(","):
        hidden, rounds = (int(x) for x in size.split(":"))
        for _ in range(args.repeat):
            for mode in args.modes.split(","):
                row = run_once(args.config, mode, hidden, rounds, extra)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.out:
                    with args.out.open("a") as out:
                        out.write(json.dumps(row) + "\n")
    print("\n| hidden_dim | rounds | mode | round s (per run) | command s (per run) | hash |")
    print("|---|---|---|---|---|---|")
    for size in args.sizes.split(","):
        hidden, rounds = (int(x) for x in size.split(":"))
        hashes = {r["model_hash"] for r in rows if r["hidden_dim"] == hidden}
        for mode in args.modes.split(","):
            cell = [r for r in rows if r["hidden_dim"] == hidden and r["mode"] == mode]
            per_round = ", ".join(f"{r['round_s']:.3f}" for r in cell)
            wall = ", ".join(f"{r['wall_s']:.1f}" for r in cell)
            same = "same" if len(hashes) == 1 else "DIFFERS"
            print(f"| {hidden} | {rounds} | {mode} | {per_round} | {wall} | {same} |")


if __name__ == "__main__":
    main()
