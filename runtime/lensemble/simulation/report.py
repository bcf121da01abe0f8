"""The run report plot: held-out error per round against every baseline, and bytes sent."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

_SCORED = ("federated", "local_only", "pooled_oracle", "fedavg")
#: Curve key prefix of a participant's local-only model in :func:`score_curves`.
LOCAL_PREFIX = "local_only:"


def _union(report: dict[str, Any]) -> float:
    return float(report["union"]["k_step_error"])


def _or_gap(report: dict[str, Any] | None) -> float:
    """The union error, or NaN where an evaluated round lacks it: matplotlib breaks the line."""
    return _union(report) if report else math.nan


def _evaluated(line: dict[str, Any]) -> bool:
    """A line with any score, or one marked ``unscored``."""
    return bool(line.get("unscored")) or any(line.get(k) for k in _SCORED)


def _local_curves(
    evaluated: Sequence[dict[str, Any]],
) -> dict[str, list[float]]:
    """``local_only:<participant>`` -> its union error at each evaluated round (NaN: a gap)."""
    pids = sorted({pid for m in evaluated for pid in m.get("local_only") or {}})
    return {
        LOCAL_PREFIX + pid: [_or_gap((m.get("local_only") or {}).get(pid)) for m in evaluated]
        for pid in pids
    }


def score_curves(metrics: Sequence[dict[str, Any]]) -> tuple[list[int], dict[str, list[float]]]:
    """The top panel's curves: union k-step error per evaluated round, NaN where one lacks it.

    An evaluated round is a line with any score, or one marked ``unscored`` (rebuilt on resume
    without the global model's scores). Every curve has a value or a NaN at every evaluated
    round, so matplotlib leaves a gap at a missing value instead of a segment across it.

    Args:
        metrics: Lines of ``metrics.jsonl`` (dicts), in round order.

    Returns:
        ``(rounds committed at each evaluated round, curves)``: ``federated``,
        ``pooled_oracle``, ``fedavg`` and ``local_only:<participant>`` (sorted), each only
        when some round has it; values are unitless errors, NaN for a gap.
    """
    evaluated = [m for m in metrics if _evaluated(m)]
    rounds = [int(m["round"]) + 1 for m in evaluated]
    curves = {
        key: [_or_gap(m.get(key)) for m in evaluated]
        for key in ("federated", "pooled_oracle", "fedavg")
        if any(m.get(key) for m in evaluated)
    }
    curves.update(_local_curves(evaluated))
    return rounds, curves


def write_report_png(
    metrics: Sequence[dict[str, Any]], path: Path, *, inner_steps: int = 1
) -> Path | None:
    """Draw ``metrics.jsonl`` lines into a two-panel PNG.

    Top: normalised k-step latent prediction error on the union of all participants' held-out
    episodes against the round, for the federated model, each participant's local-only model
    (labelled), the best of them, the pooled-data oracle and the FedAvg ablation (whichever
    the run trained), at every evaluated round; a curve lacking a round's value (a line marked
    ``unscored``, or a line of an older run rebuilt without its baselines) has a gap there
    rather than a segment across it. Bottom: cumulative bytes the federation sent
    (pseudo-gradients up plus models down) against what synchronous data-parallel training
    would send for the same steps: every participant exchanging a float32 gradient and model
    at each of the ``inner_steps`` steps of a round, i.e. ``2 * inner_steps * bytes_down`` per
    round.

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
    _plot_scores(top, metrics, plt.get_cmap("tab10"))
    _plot_bytes(bottom, metrics, inner_steps)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_scores(top: Any, metrics: Sequence[dict[str, Any]], palette: Any) -> None:
    """The top panel: union k-step error per evaluated round, every model the run scored."""
    rounds, curves = score_curves(metrics)
    _plot_local(top, rounds, curves, palette)
    for key, label, style in (
        ("pooled_oracle", "pooled-data oracle", {"color": "black", "linestyle": "--"}),
        ("fedavg", "FedAvg (outer lr 1, no momentum)", {"color": "tab:green", "linestyle": ":"}),
    ):
        if key in curves:
            top.plot(rounds, curves[key], linewidth=1.8, label=label, **style)
    top.plot(
        rounds,
        curves.get("federated", [math.nan] * len(rounds)),
        marker="o",
        markersize=4,
        linewidth=2.5,
        color="tab:blue",
        label="federated (DiLoCo)",
        zorder=5,
    )
    k = next((m["federated"]["k_steps"] for m in metrics if m.get("federated")), "k")
    top.set_ylabel(f"held-out {k}-step latent error\n(normalised; union of participants)")
    top.set_yscale("log")
    top.grid(True, which="both", alpha=0.3)
    top.set_title("Held-out error of the global model and of its baselines (lower is better)")
    # The legend sits right of the axes, never on the curves.
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def _plot_local(top: Any, rounds: list[int], curves: dict[str, list[float]], palette: Any) -> None:
    """Each participant's local-only curve, the best site (lowest last error) drawn boldest."""
    local = [key for key in curves if key.startswith(LOCAL_PREFIX)]
    if not local:
        return
    last = {
        key: next((v for v in reversed(curves[key]) if not math.isnan(v)), math.inf)
        for key in local
    }
    best = min(local, key=lambda key: (last[key], key))
    # tab10 without the federated blue and the FedAvg green.
    colours = [palette(i) for i in (1, 3, 4, 5, 6, 7, 8, 9)]
    for i, key in enumerate(local):
        top.plot(
            rounds,
            curves[key],
            color=colours[i % len(colours)],
            alpha=0.9 if key == best else 0.55,
            linewidth=2.2 if key == best else 1,
            marker="s" if key == best else None,
            markersize=4,
            label=f"{key.removeprefix(LOCAL_PREFIX)} alone"
            + (" (best site)" if key == best else ""),
        )


def _plot_bytes(bottom: Any, metrics: Sequence[dict[str, Any]], inner_steps: int) -> None:
    """The bottom panel: cumulative MB the federation sent against data-parallel training."""
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
    bottom.set_xlabel("rounds committed")  # a count: the ledger's round t is the (t+1)-th
    bottom.xaxis.get_major_locator().set_params(integer=True)
    bottom.grid(True, which="both", alpha=0.3)
    bottom.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
