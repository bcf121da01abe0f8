"""What ``lensemble simulate`` prints at the end of a run: the table, the verdicts, the files.

The table fits 80 columns (the width of a terminal, and of a pipe, a CI log or ``| tee``):
short column names, explained in its caption. The lines after it are printed whole, never
wrapped mid-path, whatever the width. Rounds are named as the ledger names them (0-based).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from lensemble.cli.progress import megabytes, plural

if TYPE_CHECKING:
    from rich.table import Table

    from lensemble.config import LensembleConfig
    from lensemble.simulation.summary import SimulationResult

#: Columns a table may take: the narrowest common terminal.
TABLE_WIDTH = 80


def print_summary(
    cfg: LensembleConfig,
    result: SimulationResult,
    png: Path | None,
    stream: IO[str] | None = None,
) -> None:
    """Print the final table, one sentence per comparison, and what the run wrote.

    Args:
        cfg: The run's config.
        result: The run's result.
        png: The report plot, if one was written.
        stream: Where to print (stdout).
    """
    from rich.console import Console

    from lensemble.simulation.summary import summary as summarise

    out = stream or sys.stdout
    summary = summarise(result, png)
    terminal = callable(getattr(out, "isatty", None)) and out.isatty()
    console = Console(file=out, width=TABLE_WIDTH, force_terminal=terminal, highlight=False)
    console.print(summary_table(cfg, result, summary))
    lines = verdicts(summary)
    privacy = summary["central_privacy"]
    if privacy is not None:
        lines.append(central_privacy_line(privacy))
    warning = summary["divergence"]["warning"]
    if warning:
        lines.append(f"Divergence: {warning} (ledger.jsonl, field guard).")
    if summary["stopped"]:
        lines.append(f"Stopped early: {summary['stopped']}")
    resumed = summary["resumed_from_version"]
    before = f", {resumed} of them before the resume" if resumed is not None else ""
    lines.append(
        f"Rounds committed {summary['rounds_committed']}{before} (aborted attempts "
        f"{summary['aborted_attempts']}); bytes up {megabytes(summary['bytes_up'])}, down "
        f"{megabytes(summary['bytes_down'])}; wall time {result.wall_s:.1f} s."
    )
    kept = summary["final_model"]
    if kept is not None:  # federation.final_model: best_reported
        lines.append(f"Final model: {kept['why']}.")
    lines.append(f"Final model hash {result.model_hash}")
    lines.append(f"Config hash      {result.config_hash}")
    files = ["ledger.jsonl", "metrics.jsonl", "coordinator/checkpoints/"]
    if png:
        files.append(png.name)
    lines.append(f"Wrote {', '.join(str(result.output_dir / f) for f in files)}")
    out.write("".join(line + "\n" for line in lines))
    out.flush()


def central_privacy_line(entry: dict[str, Any]) -> str:
    """One sentence on what central DP-FedAvg spent (the ledger's newest entry of it)."""
    releases = int(entry.get("releases", 0))
    return (
        f"Central privacy: user-level epsilon {float(entry.get('epsilon', 0.0)):.3g} at delta "
        f"{float(entry.get('delta', 0.0)):g} after {plural(releases, 'release')} (noise "
        f"multiplier {float(entry.get('noise_multiplier', 0.0)):g}, clip "
        f"{float(entry.get('clip_norm', 0.0)):g}: noise of std "
        f"{float(entry.get('noise_std', 0.0)):.3g} on every coordinate of the mean; with few "
        "participants it can outweigh the update, docs/security.md, 'Central user-level "
        "differential privacy')."
    )


def summary_table(cfg: LensembleConfig, result: SimulationResult, summary: dict[str, Any]) -> Table:
    """The held-out error of the federated model next to every baseline, per participant.

    Args:
        cfg: The run's config.
        result: The run's result (its final evaluations).
        summary: ``lensemble.simulation.summary.summary`` of ``result``.
    """
    from rich.table import Table

    final = result.final or {}
    local = result.final_local_only
    best = summary["best_single_site"]
    k = final.get("k_steps", cfg.evaluation.k_steps)
    table = Table(
        title=f"Held-out {k}-step latent error after {plural(cfg.federation.rounds, 'round')} "
        "(lower is better)",
        caption="Rows: each participant's held-out episodes, then their union. alone: the "
        "participant's own model trained alone (union: the mean of them); best alone: "
        f"{best or '-'}'s; oracle: one model on the pooled data; R²: the federated model's "
        "probe R².",
        caption_justify="left",
    )
    columns: list[tuple[str, dict[str, Any] | None]] = [
        ("participant", None),
        ("federated", final),
        ("alone", None),
        ("best alone", local.get(best) if best else None),
        ("oracle", result.final_pooled_oracle),
        ("FedAvg", result.final_fedavg),
        ("R²", None),
    ]
    for index, (name, _) in enumerate(columns):
        table.add_column(name, justify="left" if index == 0 else "right", no_wrap=True)

    def err(report: dict[str, Any] | None, pid: str | None) -> str:
        if not report:
            return "-"
        scores = report.get("union") if pid is None else report.get("participants", {}).get(pid)
        return _num((scores or {}).get("k_step_error"))

    for pid in cfg.participant_ids:
        table.add_row(
            pid,
            err(final, pid),
            err(local.get(pid), pid),
            *(err(report, pid) for _, report in columns[3:6]),
            _num(final.get("participants", {}).get(pid, {}).get("probe_r2")),
        )
    table.add_row(
        "union",
        err(final, None),
        _num(summary["local_only_mean_union_k_step_error"]),
        *(err(report, None) for _, report in columns[3:6]),
        _num(final.get("union", {}).get("probe_r2")),
        end_section=True,
    )
    return table


def verdicts(summary: dict[str, Any]) -> list[str]:
    """One sentence per comparison of the final global model with a baseline, on the union."""
    fed = summary["federated_union_k_step_error"]
    if fed is None:
        return []
    lines = []
    best, best_err = summary["best_single_site"], summary["best_single_site_union_k_step_error"]
    mean = summary["local_only_mean_union_k_step_error"]
    if best is not None:
        verdict = "beats" if fed < best_err else "does NOT beat"
        lines.append(
            f"Federated {verdict} the best site alone ({best}) on the union: {fed:.4f} vs "
            f"{best_err:.4f} (mean site alone {mean:.4f})."
        )
    oracle = summary["pooled_oracle_union_k_step_error"]
    if oracle:
        oracle_best = summary["pooled_oracle_best_round_union_k_step_error"] or oracle
        oracle_round = summary["pooled_oracle_best_round"]
        at = f" (round {oracle_round})" if oracle_round is not None else ""
        lines.append(
            f"Pooled-data oracle (no residency, same total inner steps): {oracle:.4f}, best "
            f"round{at} {oracle_best:.4f}; federated is {fed / oracle:.2f}x / "
            f"{fed / oracle_best:.2f}x it."
        )
    fedavg = summary["fedavg_union_k_step_error"]
    if fedavg is not None:
        lines.append(f"FedAvg (outer lr 1, no momentum): {fedavg:.4f}.")
    peak, peak_err = (
        summary["federated_best_round"],
        summary["federated_best_round_union_k_step_error"],
    )
    if peak is not None and peak_err:
        lines.append(
            f"Best round {peak} ({peak_err:.4f}); the final model's error is "
            f"{100 * (fed / peak_err - 1):.1f}% above it."
        )
    return lines


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"
