"""Whole-process start-up time of the CLI: ``lensemble --help`` and ``config validate``.

Median of 5 runs after one warm-up run (page cache). Target: ``--help`` under 0.5 s.

    python bench/cli_startup.py
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNS = 5


def median_seconds(cmd: list[str]) -> float:
    subprocess.run(cmd, cwd=REPO, capture_output=True, check=True)  # warm-up
    samples = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=REPO, capture_output=True, check=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    # No options: --help prints what this bench measures.
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    exe = shutil.which("lensemble") or sys.exit("lensemble is not installed (pip install -e .)")
    rows = [
        ("lensemble --help", [exe, "--help"]),
        ("lensemble --version", [exe, "--version"]),
        (
            "lensemble config validate config/local.yaml",
            [exe, "config", "validate", "config/local.yaml"],
        ),
    ]
    print(f"{'command':50} median of {RUNS} (s)")
    for name, cmd in rows:
        print(f"{name:50} {median_seconds(cmd):.3f}")


if __name__ == "__main__":
    main()
