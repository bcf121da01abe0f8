"""Cost of the Pulumi program under mocks, per stack file: what it registers and how long it runs.

Each stack runs in a fresh process (import of pulumi, pulumi_aws and the program included), then
again in that process (the program alone), median of 3. This is the share ``tests/infra`` adds
to CI: every stack runs once per test session.

    python bench/pulumi_mocks.py
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNS = 3

CHILD = """
import json, sys, time
start = time.perf_counter()
from lensemble.config import load_config
from tests.infra.recording import run_stack, stack_config
stack = sys.argv[1]
partition = load_config(stack_config(stack)["lensemble:configFile"]).deployment.cloud.partition
first = run_stack(stack, partition)
cold = time.perf_counter() - start
warm = []
for _ in range({runs}):
    t = time.perf_counter()
    run_stack(stack, partition)
    warm.append(time.perf_counter() - t)
kinds = {{r.type for r in first.resources}}
print(json.dumps({{
    "resources": len(first.resources),
    "components": sum(r.type.startswith("lensemble:") for r in first.resources),
    "aws": sum(r.type.startswith("aws:") for r in first.resources),
    "types": len(kinds),
    "cold": cold,
    "warm": sorted(warm)[len(warm) // 2],
}}))
"""


def main() -> None:
    # No options: --help prints what this bench measures.
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    stacks = sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in REPO.glob("Pulumi.*.yaml"))
    header = (
        f"{'stack':<30} {'resources':>9} {'aws':>5} {'components':>10} {'cold s':>7} {'warm s':>7}"
    )
    print(header)
    print("-" * len(header))
    for stack in stacks:
        done = subprocess.run(
            [sys.executable, "-c", CHILD.format(runs=RUNS), stack],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            print(f"{stack:<30} failed: {done.stderr.strip().splitlines()[-1]}")
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        print(
            f"{stack:<30} {row['resources']:>9} {row['aws']:>5} {row['components']:>10} "
            f"{row['cold']:>7.2f} {row['warm']:>7.2f}"
        )


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"\ntotal {time.perf_counter() - start:.1f} s (python {sys.version.split()[0]})")
