"""``lensemble simulate``: the main job, a federation of N participants on this machine."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from lensemble.cli.options import SET_HELP, load

if TYPE_CHECKING:
    from rich.console import Console

    from lensemble.config import LensembleConfig
    from lensemble.federation.simulation import SimulationResult


def _overrides(
    set_: list[str] | None, participants: int | None, rounds: int | None, output_dir: Path | None
) -> list[str]:
    items = list(set_ or [])
    if participants is not None:
        items.append(f"federation.participant_count={participants}")
        if not any(s.startswith("federation.quorum=") for s in items):
            items.append("federation.quorum=0")
    if rounds is not None:
        items.append(f"federation.rounds={rounds}")
    if output_dir is not None:
        items.append(f"run.output_dir={output_dir}")
    return items


def simulate(
    config: Path | None = typer.Argument(
        None, help="Config file (default: config/local.yaml).", metavar="[CONFIG]"
    ),
    participants: int | None = typer.Option(
        None,
        "--participants",
        "-n",
        min=1,
        help="Number of participants (listed ones first, then generated ones with their own "
        "physics); quorum becomes a strict majority unless --set federation.quorum=... is given.",
    ),
    rounds: int | None = typer.Option(None, "--rounds", "-r", min=1, help="Outer rounds."),
    set_: list[str] = typer.Option(None, "--set", "-s", help=SET_HELP, metavar="PATH=VALUE"),
    output_dir: Path | None = typer.Option(
        None, "--output-dir", "-o", help="Where to write results (default: run.output_dir)."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the run in the output folder from its last checkpoint."
    ),
    faults: str = typer.Option(
        "",
        "--faults",
        metavar="SPEC",
        help="Inject faults, e.g. 'drop:alpine@3,delay:coastal@5,reorder@2,duplicate:delta@4' "
        "(0-based rounds).",
    ),
    json_summary: bool = typer.Option(
        False, "--json", help="Print a JSON summary on stdout instead of the tables."
    ),
) -> None:
    """Train a world model with DiLoCo across the config's participants, deterministically.

    Writes ledger.jsonl, metrics.jsonl, checkpoints and report.png under the output folder and
    prints held-out error and probe R^2, federated versus each participant training alone.
    """
    from lensemble.config import default_config_path
    from lensemble.federation.faults import parse_faults

    cfg = load(config or default_config_path(), _overrides(set_, participants, rounds, output_dir))
    plan = parse_faults(faults, cfg.participant_ids)
    if cfg.federation.transport == "network":
        from lensemble.errors import UsageError

        raise UsageError(
            "federation.transport is 'network': simulate runs the in-process transport only;",
            remediation="start `lensemble coordinator` and `lensemble participant` processes, or "
            "pass --set federation.transport=in_process.",
        )
    result = _run_with_progress(cfg, plan, resume)
    from lensemble.federation.plot import write_report_png
    from lensemble.federation.simulation import read_metrics

    png = write_report_png(read_metrics(result.output_dir), result.output_dir / "report.png")
    if json_summary:
        sys.stdout.write(json.dumps(_summary(result, png), sort_keys=True) + "\n")
    else:
        _print_tables(cfg, result, png)


def _run_with_progress(cfg: LensembleConfig, plan: Any, resume: bool) -> SimulationResult:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from lensemble.federation.rounds import RoundState
    from lensemble.federation.simulation import run_simulation

    err = Console(stderr=True)
    fed = cfg.federation
    err.print(
        f"[bold]lensemble simulate[/bold]: {len(fed.participants)} participants, "
        f"{fed.rounds} rounds x {fed.inner_steps} inner steps, {cfg.data.env_id}, "
        f"quantization {fed.quantization} -> {cfg.run.output_dir}"
    )
    progress = Progress(
        TextColumn("[bold blue]round"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    )

    class Observer:
        def on_state(self, round_index: int, attempt: int, state: RoundState) -> None:
            if state == RoundState.OPEN:
                progress.update(task, description=f"round {round_index}: training...")

        def on_verdict(self, submission: Any, verdict: Any) -> None:
            if not verdict.accepted:
                err.print(
                    f"  [yellow]round {submission.round_index}: rejected {submission.sender}: "
                    f"{verdict.reason} ({verdict.message})"
                )

        def on_round(self, record: Any) -> None:
            if record.state == "aborted":
                err.print(
                    f"  [red]round {record.round} attempt {record.attempt} aborted: "
                    f"{len(record.contributors)} of {fed.quorum} required contributors "
                    f"(excluded: {record.excluded})"
                )
                return
            loss = f"{record.mean_inner_loss:.4f}" if record.mean_inner_loss is not None else "-"
            progress.update(
                task,
                advance=1,
                description=f"contributors {len(record.contributors)}/{len(fed.participants)}"
                f"  inner loss {loss}  bytes up {_mb(record.bytes_up)} down "
                f"{_mb(record.bytes_down)}",
            )

    with progress:
        task = progress.add_task("collecting data...", total=fed.rounds, completed=0)
        result = run_simulation(cfg, faults=plan, resume=resume, observer=Observer())
        progress.update(task, completed=fed.rounds)
    return result


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _summary(result: SimulationResult, png: Path | None) -> dict[str, Any]:
    from lensemble.federation.simulation import mean_local_only_union

    final = result.final or {}
    committed = [r for r in result.records if r.state == "closed"]
    return {
        "config_hash": result.config_hash,
        "model_hash": result.model_hash,
        "rounds_committed": len(committed),
        "aborted_attempts": sum(r.state == "aborted" for r in result.records),
        "federated_union_k_step_error": final.get("union", {}).get("k_step_error"),
        "federated_union_probe_r2": final.get("union", {}).get("probe_r2"),
        "local_only_mean_union_k_step_error": mean_local_only_union(result.final_local_only),
        "bytes_up": sum(r.bytes_up for r in result.records),
        "bytes_down": sum(r.bytes_down for r in result.records),
        "wall_s": round(result.wall_s, 3),
        "output_dir": str(result.output_dir),
        "report_png": str(png) if png else None,
    }


def _print_tables(cfg: LensembleConfig, result: SimulationResult, png: Path | None) -> None:
    from rich.console import Console
    from rich.table import Table

    out: Console = Console()
    if not out.is_terminal:
        out.width = 120  # piped or captured: do not squeeze the table into 80 columns
    final = result.final or {}
    local = result.final_local_only
    k = final.get("k_steps", cfg.evaluation.k_steps)
    table = Table(
        title=f"Held-out evaluation after {cfg.federation.rounds} rounds "
        f"({k}-step latent error: lower is better; probe R²: higher is better)"
    )
    for column, justify in (
        ("participant", "left"),
        ("trust domain", "left"),
        ("federated error", "right"),
        ("local-only error", "right"),
        ("federated R²", "right"),
        ("local-only R²", "right"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for pid in cfg.participant_ids:
        fed_s = final.get("participants", {}).get(pid, {})
        loc_s = local.get(pid, {}).get("participants", {}).get(pid, {}) if local else {}
        table.add_row(
            pid,
            cfg.participant(pid).trust_domain,
            _num(fed_s.get("k_step_error")),
            _num(loc_s.get("k_step_error")),
            _num(fed_s.get("probe_r2")),
            _num(loc_s.get("probe_r2")),
        )
    summary = _summary(result, png)
    union = final.get("union", {})
    mean_r2 = sum(r["union"]["probe_r2"] for r in local.values()) / len(local) if local else None
    table.add_row(
        "[bold]union of all",
        "(held-out, every participant)",
        _num(union.get("k_step_error")),
        _num(summary["local_only_mean_union_k_step_error"]) + " (mean)",
        _num(union.get("probe_r2")),
        _num(mean_r2) + " (mean)",
        end_section=True,
    )
    out.print(table)
    fed_err, loc_err = union.get("k_step_error"), summary["local_only_mean_union_k_step_error"]
    if fed_err is not None and loc_err is not None:
        verdict = "better" if fed_err < loc_err else "NOT better"
        out.print(
            f"Federated model is {verdict} than training alone on the union of held-out data: "
            f"{fed_err:.4f} vs {loc_err:.4f} (mean local-only)."
        )
    out.print(
        f"Rounds committed {summary['rounds_committed']} (aborted attempts "
        f"{summary['aborted_attempts']}); bytes up {_mb(summary['bytes_up'])}, down "
        f"{_mb(summary['bytes_down'])}; wall time {result.wall_s:.1f} s."
    )
    out.print(f"Final model hash {result.model_hash}")
    out.print(f"Config hash      {result.config_hash}")
    files = ["ledger.jsonl", "metrics.jsonl", "coordinator/checkpoints/"]
    if png:
        files.append(png.name)
    out.print(f"Wrote {', '.join(str(result.output_dir / f) for f in files)}")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"
