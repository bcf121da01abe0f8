"""The Compose stack on a real engine against the same federation as host processes.

Measured in one run, on one machine, with the same config (``config/local.yaml`` over the
network transport with mutual TLS, 4 participants):

1. **Up to ready**: seconds from starting ``lensemble up`` to each service's ready line (the
   stack is ready when the last one arrives), containers created and started by the engine.
2. **Per-round wall seconds**: the ledger's ``wall_s`` of every committed round, on containers
   (each role in its own container under the config's CPU and memory limits) and as host
   processes (``lensemble simulate --set federation.transport=network``: the same coordinator and
   participant processes on loopback, no limits). Median and range over the rounds.
3. Whether both committed the same hash chain (they must).

Needs a Docker engine and the CPU image (``lensemble image build``).

    python bench/compose_stack.py                  # 5 rounds
    python bench/compose_stack.py --rounds 10 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def ledger(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines()
    records = [line["record"] for line in map(json.loads, lines)]  # ledger v2
    return [r for r in records if r.get("state") == "closed"]


def run_compose(rounds: int, work: Path) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """`lensemble up`: seconds to each ready line, and the committed ledger lines."""
    stack = work / "stack"
    args = [
        "lensemble", "up", "--substrate", "compose", "--config", "config/local.yaml",
        "--set", "federation.transport=network", "--set", f"federation.rounds={rounds}",
        "--set", f"run.name=lens-bench-{uuid.uuid4().hex[:6]}", "--dir", str(stack),
    ]  # fmt: skip
    start = time.monotonic()
    ready: dict[str, float] = {}
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.startswith("ready: "):
                ready[line.split()[1]] = time.monotonic() - start
        if proc.wait() != 0:
            sys.exit("lensemble up failed; run it by hand to see why")
    finally:
        subprocess.run(
            ["lensemble", "down", "--dir", str(stack), "--volumes"],
            cwd=REPO, capture_output=True, check=False,
        )  # fmt: skip
    return ready, ledger(stack / "ledger.jsonl")


def run_host(rounds: int, work: Path) -> list[dict[str, Any]]:
    """The same federation as host processes on loopback."""
    out = work / "host"
    subprocess.run(
        ["lensemble", "simulate", "config/local.yaml", "--set", "federation.transport=network",
         "--rounds", str(rounds), "-o", str(out), "--json"],
        cwd=REPO, check=True, capture_output=True,
    )  # fmt: skip
    return ledger(out / "ledger.jsonl")


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} s  ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds per run (default 5)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each (default 1)")
    opts = parser.parse_args()
    results: list[dict[str, Any]] = []
    for rep in range(opts.repeat):
        with tempfile.TemporaryDirectory(prefix="lensemble-bench-") as tmp:
            work = Path(tmp)
            ready, on_containers = run_compose(opts.rounds, work)
            on_host = run_host(opts.rounds, work)
        same = [r["model_hash"] for r in on_containers] == [r["model_hash"] for r in on_host]
        print(f"run {rep + 1}: up to every ready line {max(ready.values()):.1f} s")
        for service, seconds in sorted(ready.items(), key=lambda kv: kv[1]):
            print(f"  {service:<24} {seconds:6.1f} s")
        print(f"  round wall, containers:    {spread([r['wall_s'] for r in on_containers])}")
        print(f"  round wall, host processes: {spread([r['wall_s'] for r in on_host])}")
        print(f"  same hash chain: {same}")
        results.append(
            {
                "up_to_ready_s": round(max(ready.values()), 1),
                "round_wall_containers_s": [r["wall_s"] for r in on_containers],
                "round_wall_host_s": [r["wall_s"] for r in on_host],
                "same_chain": same,
                "final_hash": on_containers[-1]["model_hash"],
            }
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
