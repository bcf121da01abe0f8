"""The run report plot: held-out error per round (federated vs local-only) and bytes per round."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def write_report_png(metrics: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """Draw ``metrics.jsonl`` lines into a two-panel PNG.

    Top: normalised k-step latent prediction error on the union of all participants' held-out
    episodes, for the global (federated) model and for each participant's local-only model (thin
    lines) and their mean. Bottom: pseudo-gradient bytes up and model bytes down per round.

    Args:
        metrics: Lines of ``metrics.jsonl`` (dicts), in round order.
        path: Where to write the PNG.

    Returns:
        ``path``, or None when there is nothing to plot.
    """
    if not metrics:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    evaluated = [m for m in metrics if m.get("federated")]
    rounds = [m["round"] + 1 for m in evaluated]
    top.plot(
        rounds,
        [m["federated"]["union"]["k_step_error"] for m in evaluated],
        marker="o",
        color="tab:blue",
        label="federated (DiLoCo)",
    )
    with_baseline = [m for m in evaluated if m.get("local_only")]
    if with_baseline:
        pids = sorted(with_baseline[0]["local_only"])
        for pid in pids:
            top.plot(
                [m["round"] + 1 for m in with_baseline],
                [m["local_only"][pid]["union"]["k_step_error"] for m in with_baseline],
                color="tab:orange",
                alpha=0.3,
                linewidth=1,
            )
        top.plot(
            [m["round"] + 1 for m in with_baseline],
            [
                sum(m["local_only"][p]["union"]["k_step_error"] for p in pids) / len(pids)
                for m in with_baseline
            ],
            marker="s",
            color="tab:orange",
            label="local-only (mean; thin: each participant)",
        )
    k = evaluated[0]["federated"]["k_steps"] if evaluated else "k"
    top.set_ylabel(f"held-out {k}-step latent error\n(normalised, union of participants)")
    top.set_yscale("log")
    top.grid(True, alpha=0.3)
    top.legend()
    all_rounds = [m["round"] + 1 for m in metrics]
    width = 0.4
    bottom.bar(
        [r - width / 2 for r in all_rounds],
        [m["bytes_up"] / 1e6 for m in metrics],
        width,
        label="pseudo-gradients up",
    )
    bottom.bar(
        [r + width / 2 for r in all_rounds],
        [m["bytes_down"] / 1e6 for m in metrics],
        width,
        label="model down",
    )
    bottom.set_ylabel("MB per round")
    bottom.set_xlabel("round")
    bottom.xaxis.get_major_locator().set_params(integer=True)
    bottom.grid(True, axis="y", alpha=0.3)
    bottom.legend(loc="lower right", framealpha=0.9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
