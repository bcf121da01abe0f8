"""The run report plot: held-out error per round against every baseline, and bytes sent."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any


def _union(report: dict[str, Any]) -> float:
    return float(report["union"]["k_step_error"])


def write_report_png(
    metrics: Sequence[dict[str, Any]], path: Path, *, inner_steps: int = 1
) -> Path | None:
    """Draw ``metrics.jsonl`` lines into a two-panel PNG.

    Top: normalised k-step latent prediction error on the union of all participants' held-out
    episodes against the round, for the federated model, each participant's local-only model
    (labelled), the best of them, the pooled-data oracle and the FedAvg ablation (whichever
    the run trained). Bottom: cumulative bytes the federation sent (pseudo-gradients up plus
    models down) against what synchronous data-parallel training would send for the same
    steps: every participant exchanging a float32 gradient and model at each of the
    ``inner_steps`` steps of a round, i.e. ``2 * inner_steps * bytes_down`` per round.

    Args:
        metrics: Lines of ``metrics.jsonl`` (dicts), in round order.
        path: Where to write the PNG.
        inner_steps: Inner steps per round ``H`` (``federation.inner_steps``).

    Returns:
        ``path``, or None when there is nothing to plot.
    """
    if not metrics:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(10, 7.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    evaluated = [m for m in metrics if m.get("federated")]
    rounds = [m["round"] + 1 for m in evaluated]
    with_local = [m for m in evaluated if m.get("local_only")]
    if with_local:
        local_rounds = [m["round"] + 1 for m in with_local]
        pids = sorted(with_local[-1]["local_only"])
        best = min(pids, key=lambda p: _union(with_local[-1]["local_only"][p]))
        # tab10 without the federated blue and the FedAvg green.
        palette = plt.get_cmap("tab10")
        colours = [palette(i) for i in (1, 3, 4, 5, 6, 7, 8, 9)]
        for i, pid in enumerate(pids):
            top.plot(
                local_rounds,
                [_union(m["local_only"][pid]) for m in with_local],
                color=colours[i % len(colours)],
                alpha=0.9 if pid == best else 0.55,
                linewidth=2.2 if pid == best else 1,
                marker="s" if pid == best else None,
                markersize=4,
                label=f"{pid} alone" + (" (best site)" if pid == best else ""),
            )
    for key, label, style in (
        ("pooled_oracle", "pooled-data oracle", {"color": "black", "linestyle": "--"}),
        ("fedavg", "FedAvg (outer lr 1, no momentum)", {"color": "tab:green", "linestyle": ":"}),
    ):
        scored = [m for m in evaluated if m.get(key)]
        if scored:
            top.plot(
                [m["round"] + 1 for m in scored],
                [_union(m[key]) for m in scored],
                linewidth=1.8,
                label=label,
                **style,
            )
    top.plot(
        rounds,
        [_union(m["federated"]) for m in evaluated],
        marker="o",
        markersize=4,
        linewidth=2.5,
        color="tab:blue",
        label="federated (DiLoCo)",
        zorder=5,
    )
    k = evaluated[0]["federated"]["k_steps"] if evaluated else "k"
    top.set_ylabel(f"held-out {k}-step latent error\n(normalised; union of participants)")
    top.set_yscale("log")
    top.grid(True, which="both", alpha=0.3)
    top.set_title("Held-out error of the global model and of its baselines (lower is better)")
    # The legend sits right of the axes, never on the curves.
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)

    all_rounds = [m["round"] + 1 for m in metrics]
    sent = list(accumulate((m["bytes_up"] + m["bytes_down"]) / 1e6 for m in metrics))
    data_parallel = list(accumulate(2 * inner_steps * m["bytes_down"] / 1e6 for m in metrics))
    bottom.plot(all_rounds, sent, marker="o", markersize=3, color="tab:blue", label="federated")
    bottom.plot(
        all_rounds,
        data_parallel,
        color="tab:red",
        linestyle="--",
        label=f"synchronous data-parallel\n(same steps; x{inner_steps} per round)",
    )
    bottom.set_yscale("log")
    bottom.set_ylabel("cumulative MB sent\n(up + down, all participants)")
    bottom.set_xlabel("round")
    bottom.xaxis.get_major_locator().set_params(integer=True)
    bottom.grid(True, which="both", alpha=0.3)
    bottom.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
