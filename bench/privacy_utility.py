"""A first privacy-utility table: the default config with every participant under DP-SGD.

For each epsilon (``inf``: no differential privacy), gives every participant of
``config/local.yaml`` its own ``privacy: {epsilon: E, delta: 1e-5}`` (the other fields at their
defaults: q = 0.25, C = 1, 8 windows per record, sigma derived so the 20 planned rounds spend
exactly E), runs the in-process federation (ledger, checkpoints, evaluation as
``lensemble simulate``) and prints the final union k-step error with the run's own baselines
(each site alone, their best and mean, without DP), the spend each participant reported last
and the wall time. One seed per call; the issue's full table (3 seeds, a membership-inference
attack) is not built yet:

    nice -n 10 python bench/privacy_utility.py --epsilons 1,3,8,inf --seed 7
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

from lensemble.config import load_config
from lensemble.simulation.in_process import run_in_process
from lensemble.simulation.summary import best_single_site, mean_local_only_union

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    """Run one federation per epsilon and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilons", default="1,3,8,inf", help="comma-separated; inf: no DP")
    parser.add_argument("--seed", type=int, default=7, help="run.root_seed")
    parser.add_argument("--delta", type=float, default=1e-5)
    args = parser.parse_args()
    rows = []
    for text in args.epsilons.split(","):
        epsilon = float(text)
        with tempfile.TemporaryDirectory() as tmp:
            overrides = [f"run.output_dir={tmp}", f"run.root_seed={args.seed}"]
            base = load_config(REPO / "config" / "local.yaml", overrides)
            if math.isfinite(epsilon):
                overrides += [
                    f"federation.participants[{i}].privacy="
                    f"{{epsilon: {epsilon}, delta: {args.delta}}}"
                    for i in range(len(base.federation.participants))
                ]
            config = load_config(REPO / "config" / "local.yaml", overrides)
            start = time.perf_counter()
            result = run_in_process(config)
            wall = time.perf_counter() - start
        assert result.final is not None
        last = result.records[-1]
        spent = {pid: report.get("privacy_epsilon") for pid, report in last.self_reported.items()}
        best = best_single_site(result.final_local_only)
        rows.append(
            (
                text,
                float(result.final["union"]["k_step_error"]),
                best[1] if best else math.nan,
                mean_local_only_union(result.final_local_only) or math.nan,
                len(last.contributors),
                max((v for v in spent.values() if v is not None), default=None),
                wall,
            )
        )
        print(rows[-1], flush=True)
    print(f"seed {args.seed}, delta {args.delta}")
    print(
        "epsilon | union error | best site alone | mean site alone | last contributors | "
        "max spent | wall s"
    )
    for e, union, best_alone, mean_alone, n, spent_max, wall in rows:
        spent_text = "-" if spent_max is None else f"{spent_max:.2f}"
        print(
            f"{e:>7} | {union:.4f} | {best_alone:.4f} | {mean_alone:.4f} | {n} | "
            f"{spent_text} | {wall:.0f}"
        )


if __name__ == "__main__":
    main()
