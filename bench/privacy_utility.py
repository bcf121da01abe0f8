"""The privacy-utility table: the default config with every participant under DP-SGD, over seeds.

For each seed and each epsilon (``inf``: no differential privacy), gives every participant of
``config/local.yaml`` its own ``privacy: {epsilon: E, delta: 1e-5}`` (the other fields at their
defaults: q = 0.25, C = 1, 8 windows per record, sigma derived so the 20 planned rounds spend
exactly E), runs the in-process federation (ledger, checkpoints, evaluation as
``lensemble simulate``) and records:

- the final union k-step error, with the run's own baselines (each site alone, their best and
  mean, without DP), the spend each participant reported last, and the wall time;
- a loss-threshold membership-inference attack (Yeom et al., "Privacy Risk in Machine Learning",
  CSF 2018) on the final model: for every site, each training episode (a record: the unit
  DP-SGD protects) is a member and each held-out episode a non-member; the attacker scores an
  episode by the model's k-step error on it, and calls the lower-error ones members. Reported as
  the attack's AUC over every (member, non-member) pair of the same site (ties count half), so
  the sites' different difficulty does not help the attacker: 0.5 is a coin toss, 1.0 a perfect
  attack. With 18 members and 6 non-members per site one run's AUC is noisy: its standard
  error (Hanley and McNeil) is printed beside the mean over seeds.

One JSON line per (seed, epsilon) goes to ``--out`` (appended; a cell already there is skipped,
so a stopped table continues), and the table of means over the seeds is printed at the end:

    nice -n 10 python bench/privacy_utility.py --epsilons 1,3,8,inf --seeds 7,1,2 \\
        --out runs/privacy.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from lensemble.config import load_config
from lensemble.config.schema import LensembleConfig
from lensemble.data.trajectories import ParticipantData, load_or_collect
from lensemble.federation.checkpoint import CheckpointStore
from lensemble.model.kstep import heldout_error
from lensemble.model.worldmodel import build_model
from lensemble.simulation.in_process import run_in_process
from lensemble.simulation.summary import best_single_site, mean_local_only_union

REPO = Path(__file__).resolve().parents[1]


def episode_errors(
    config: LensembleConfig, params: dict[str, torch.Tensor], data: ParticipantData
) -> tuple[list[float], list[float]]:
    """The final model's k-step error on each training (member) and held-out episode."""
    model = build_model(config, data.spec)
    k = config.evaluation.k_steps

    def each(episodes: Any) -> list[float]:
        scores = [
            heldout_error(model, params, episodes.select([i]), k) for i in range(len(episodes.obs))
        ]
        return [math.inf if s is None else s for s in scores]

    return each(data.train), each(data.holdout)


def attack_auc(sites: list[tuple[list[float], list[float]]]) -> float:
    """AUC of "lower error means member" over same-site (member, non-member) pairs.

    Args:
        sites: Per site, (members' errors, non-members' errors).

    Returns:
        The AUC in [0, 1] (ties count half); NaN without a pair.
    """
    wins = [
        1.0 if m < o else 0.5 if m == o else 0.0
        for members, others in sites
        for m in members
        for o in others
    ]
    return statistics.fmean(wins) if wins else math.nan


def auc_standard_error(auc: float, members: int, non_members: int) -> float:
    """Hanley and McNeil's standard error of an AUC (Radiology 143(1), 1982, equation 2)."""
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    variance = (
        auc * (1 - auc) + (members - 1) * (q1 - auc * auc) + (non_members - 1) * (q2 - auc * auc)
    ) / (members * non_members)
    return math.sqrt(max(variance, 0.0))


def run_cell(seed: int, epsilon_text: str, delta: float) -> dict[str, Any]:
    """One federation at ``seed`` under ``epsilon_text`` for every participant, scored."""
    epsilon = float(epsilon_text)
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [f"run.output_dir={tmp}", f"run.root_seed={seed}"]
        base = load_config(REPO / "config" / "local.yaml", overrides)
        if math.isfinite(epsilon):
            overrides += [
                f"federation.participants[{i}].privacy={{epsilon: {epsilon}, delta: {delta}}}"
                for i in range(len(base.federation.participants))
            ]
        config = load_config(REPO / "config" / "local.yaml", overrides)
        start = time.perf_counter()
        result = run_in_process(config)
        wall = time.perf_counter() - start
        final = CheckpointStore(Path(tmp)).load()
        assert final is not None and result.final is not None
        datasets = {pid: load_or_collect(config, pid) for pid in config.participant_ids}
        sites = [episode_errors(config, final.params, datasets[pid]) for pid in sorted(datasets)]
    auc = attack_auc(sites)
    last = result.records[-1]
    spent = [r.get("privacy_epsilon") for r in last.self_reported.values()]
    best = best_single_site(result.final_local_only)
    return {
        "seed": seed,
        "epsilon": epsilon_text,
        "delta": delta,
        "union": float(result.final["union"]["k_step_error"]),
        "best_site_alone": best[1] if best else None,
        "mean_site_alone": mean_local_only_union(result.final_local_only),
        "last_contributors": len(last.contributors),
        "max_spent": max((float(v) for v in spent if v is not None), default=None),
        "attack_auc": auc,
        "members": sum(len(m) for m, _ in sites),
        "non_members": sum(len(o) for _, o in sites),
        "wall_s": wall,
    }


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per epsilon, means over the seeds present."""
    lines = [
        "| epsilon | seeds | union error | best site alone (no DP) | mean site alone (no DP) "
        "| max spent | attack AUC (mean; range) | one run's AUC standard error | wall s (mean) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = sorted({r["epsilon"] for r in rows}, key=lambda e: -float(e))
    for e in order:
        cell = [r for r in rows if r["epsilon"] == e]
        aucs = [r["attack_auc"] for r in cell]
        se = statistics.fmean(
            auc_standard_error(r["attack_auc"], r["members"], r["non_members"]) for r in cell
        )
        spent = [r["max_spent"] for r in cell if r["max_spent"] is not None]
        spent_text = f"{max(spent):.2f}" if spent else "-"
        lines.append(
            f"| {e} | {len(cell)} | {statistics.fmean(r['union'] for r in cell):.4f} "
            f"| {statistics.fmean(r['best_site_alone'] for r in cell):.4f} "
            f"| {statistics.fmean(r['mean_site_alone'] for r in cell):.4f} "
            f"| {spent_text} | {statistics.fmean(aucs):.3f}; {min(aucs):.3f}-{max(aucs):.3f} "
            f"| {se:.3f} | {statistics.fmean(r['wall_s'] for r in cell):.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    """Run one federation per (seed, epsilon), append each to ``--out``, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilons", default="1,3,8,inf", help="comma-separated; inf: no DP")
    parser.add_argument("--seeds", default="7,1,2", help="comma-separated run.root_seed values")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--out", type=Path, default=Path("runs/privacy.jsonl"))
    parser.add_argument("--table-only", action="store_true", help="summarise --out and stop")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = (
        [json.loads(line) for line in args.out.read_text().splitlines()]
        if args.out.exists()
        else []
    )
    if not args.table_only:
        done = {(r["seed"], r["epsilon"]) for r in rows}
        for seed in (int(s) for s in args.seeds.split(",")):
            for e in args.epsilons.split(","):
                if (seed, e) in done:
                    continue
                row = run_cell(seed, e, args.delta)
                rows.append(row)
                with args.out.open("a") as out:
                    out.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
    print(f"delta {args.delta}; seeds {sorted({r['seed'] for r in rows})}")
    print(table(rows))


if __name__ == "__main__":
    main()
