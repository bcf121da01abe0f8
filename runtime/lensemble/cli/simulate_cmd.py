"""``lensemble simulate``: the main job, a federation of N participants on this machine."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from lensemble.cli.options import SetOption, load
from lensemble.errors import Interrupted, LensembleError, UsageError

if TYPE_CHECKING:
    from rich.console import Console

    from lensemble.config import LensembleConfig
    from lensemble.federation.faults import FaultPlan
    from lensemble.simulation.summary import SimulationResult


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
    set_: list[str] = SetOption,
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
        "(0-based rounds), or attacks, e.g. 'scaled:delta@0-=-9.5', 'alie:delta@10-' "
        "(docs/attacks.md).",
    ),
    json_summary: bool = typer.Option(
        False, "--json", help="Print a JSON summary on stdout instead of the tables."
    ),
) -> None:
    """Train a world model with DiLoCo across the config's participants, deterministically.

    Writes ledger.jsonl, metrics.jsonl, checkpoints and report.png under the output folder and
    prints the held-out error of the federated model next to each participant training alone,
    the best of them, the pooled-data oracle and the FedAvg ablation.
    """
    from lensemble.config import default_config_path
    from lensemble.federation.faults import parse_faults

    overrides = _overrides(set_, participants, rounds, output_dir)
    cfg = load(config or default_config_path(), overrides)
    plan = parse_faults(faults, cfg.participant_ids)
    _check_faults(cfg, plan)  # before the output folder is touched
    try:
        result = _run(cfg, config or default_config_path(), overrides, resume, plan)
    except KeyboardInterrupt:
        raise Interrupted(
            f"simulation interrupted; the committed rounds stay in {cfg.run.output_dir};",
            remediation="continue it with the same command plus --resume.",
        ) from None
    except LensembleError as exc:
        if json_summary:
            error = {"error": exc.message, "code": exc.code, "exit_code": exc.exit_code}
            sys.stdout.write(json.dumps(error, sort_keys=True) + "\n")
        raise
    _report(cfg, result, json_summary)


def _check_faults(cfg: LensembleConfig, plan: FaultPlan) -> None:
    """Refuse a fault plan this run cannot apply.

    Raises:
        UsageError: A fault targets a round past the run, a transport fault meets the network
            transport, or a rank_kill names a rank its participant does not have.
    """
    from lensemble.federation.faults import PARTICIPANT_KINDS

    late = [f for f in plan.faults if f.round_index >= cfg.federation.rounds]
    if late:
        raise UsageError(
            f"--faults targets round {late[0].round_index}, but the run has "
            f"{cfg.federation.rounds} rounds (0 to {cfg.federation.rounds - 1});",
            remediation="use a round inside the run or raise --rounds.",
        )
    in_transport = [f for f in plan.faults if f.kind not in PARTICIPANT_KINDS]
    if cfg.federation.transport == "network" and in_transport:
        raise UsageError(
            "--faults injects faults into the in-process transport only (here "
            f"'{in_transport[0].spec()}'), except rank_kill, misreport and the estimating "
            "attacks, which a participant process applies to itself;",
            remediation="drop those entries, or kill and restart the processes of a network run.",
        )
    if any(f.kind == "rank_kill" for f in plan.faults):
        from lensemble.simulation.in_process import check_rank_faults

        check_rank_faults(cfg, plan)


def _run(
    cfg: LensembleConfig, config: Path, overrides: list[str], resume: bool, plan: FaultPlan
) -> SimulationResult:
    """Run the federation in its output folder, held for the run's life."""
    from lensemble.run_lock import run_folder_lock
    from lensemble.simulation.output import prepare_output_dir

    note = prepare_output_dir(cfg, resume)
    # One run per folder, held for the run's life; a second run exits 2 at once.
    with run_folder_lock(Path(cfg.run.output_dir)):
        if resume:  # a signed run without its key (or the reverse): refused before anything
            from lensemble.federation.record_keys import require_matching_key
            from lensemble.federation.signing import signer_from_env

            require_matching_key(
                Path(cfg.run.output_dir), cfg.observability.ledger_path, signer_from_env()
            )
        if note is not None:
            sys.stderr.write(note + "\n")
        if cfg.federation.transport == "network":
            return _run_network(cfg, config, overrides, resume, plan)
        return _run_with_progress(cfg, plan, resume)


def _report(cfg: LensembleConfig, result: SimulationResult, json_summary: bool) -> None:
    """Draw report.png, then print the JSON summary or the tables."""
    from lensemble.simulation.output import REPORT_FILE, read_metrics
    from lensemble.simulation.report import write_report_png
    from lensemble.simulation.summary import summary

    png = write_report_png(
        read_metrics(result.output_dir),
        result.output_dir / REPORT_FILE,
        inner_steps=cfg.federation.inner_steps,
    )
    if json_summary:
        sys.stdout.write(json.dumps(summary(result, png), sort_keys=True) + "\n")
    else:
        _print_tables(cfg, result, png)


def _run_with_progress(cfg: LensembleConfig, plan: Any, resume: bool) -> SimulationResult:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from lensemble.federation.rounds import RoundState
    from lensemble.simulation.in_process import run_in_process

    err = Console(stderr=True)
    if not err.is_terminal:
        err.width = 120  # logs and CI: do not cut the progress line at 80 columns
    fed = cfg.federation
    err.print(
        f"[bold]lensemble simulate[/bold]: {len(fed.participants)} participants, "
        f"{_plural(fed.rounds, 'round')} x {fed.inner_steps} inner steps, {cfg.data.env_id}, "
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
            for note in rank_failure_notes(
                record.round, record.attempt, record.state, record.excluded, fed.rounds
            ):
                err.print(f"  [yellow]{note}")
            if record.state == "aborted":
                err.print(
                    f"  [red]round {record.round} attempt {record.attempt} aborted: "
                    f"{len(record.contributors)} of {fed.quorum} required contributors "
                    f"(excluded: {', '.join(f'{k}={v}' for k, v in record.excluded.items())})"
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
        result = run_in_process(cfg, faults=plan, resume=resume, observer=Observer())
        progress.update(task, completed=fed.rounds)
    return result


def _run_network(
    cfg: LensembleConfig, path: Path, overrides: list[str], resume: bool, plan: Any
) -> SimulationResult:
    """Coordinator and participants as processes on loopback (simulation.local_processes)."""
    from rich.console import Console

    from lensemble.federation.payload import manifest
    from lensemble.model.inner_loop import initial_global_parameters
    from lensemble.network.shared.payload_limits import payload_limits
    from lensemble.simulation.local_processes import run_local_processes

    # A message cap below the model's wire size is refused here (exit 2), before any process.
    payload_limits(cfg, manifest(initial_global_parameters(cfg)))
    err = Console(stderr=True)
    fed = cfg.federation
    err.print(
        f"[bold]lensemble simulate[/bold] (network transport, TLS "
        f"{'on' if cfg.network.tls.enabled else 'off'}, auth {cfg.network.auth}): 1 coordinator "
        f"and {len(fed.participants)} participant processes, {fed.rounds} rounds -> "
        f"{cfg.run.output_dir} (logs in {Path(cfg.run.output_dir) / 'logs'})"
    )

    def on_round(event: dict[str, Any]) -> None:
        contributors = event.get("contributors", [])
        excluded = event.get("excluded") or {}
        for note in rank_failure_notes(
            int(event.get("round", 0)),
            int(event.get("attempt", 0)),
            str(event.get("state", "")),
            excluded,
            fed.rounds,
        ):
            err.print(f"  {note}")
        err.print(
            f"  round {event.get('round')} attempt {event.get('attempt')} {event.get('state')}: "
            f"{len(contributors)}/{len(fed.participants)} contributors"
            + (f", excluded {excluded}" if excluded else "")
            + f", {str(event.get('model_hash', ''))[:19]}..."
        )

    return run_local_processes(path, overrides, cfg, resume=resume, on_round=on_round, faults=plan)


def rank_failure_notes(
    round_index: int, attempt: int, state: str, excluded: dict[str, str], rounds: int
) -> list[str]:
    """One line per participant a dead rank kept out of a round attempt (``rank_failure``).

    Torch's own report of the dead rank is held back (:class:`lensemble.ranks.launch.
    RankDeaths`), so this is what a person reads about it.

    Args:
        round_index: The round.
        attempt: The attempt.
        state: ``closed`` or ``aborted``.
        excluded: Participant id -> why it did not contribute (the ledger's ``excluded``).
        rounds: ``federation.rounds`` (the last round has no next one to rejoin).

    Returns:
        The lines, in participant id order (empty when no rank failed).
    """
    if state == "aborted":
        where, rejoin = f"round {round_index} attempt {attempt}", " and rejoins in the next attempt"
    else:
        where = f"round {round_index}"
        rejoin = f" and rejoins in round {round_index + 1}" if round_index + 1 < rounds else ""
    return [
        f"{where}: a rank of participant {pid} failed; {pid} is excluded with reason "
        f"rank_failure{rejoin}"
        for pid, why in sorted(excluded.items())
        if why == "rank_failure"
    ]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _print_tables(cfg: LensembleConfig, result: SimulationResult, png: Path | None) -> None:
    from rich.console import Console
    from rich.table import Table

    from lensemble.simulation.summary import summary as summarise

    out: Console = Console()
    if not out.is_terminal:
        out.width = 120  # piped or captured: do not squeeze the table into 80 columns
    final = result.final or {}
    local = result.final_local_only
    summary = summarise(result, png)
    best = summary["best_single_site"]
    k = final.get("k_steps", cfg.evaluation.k_steps)
    table = Table(
        title=f"Held-out {k}-step latent error after {cfg.federation.rounds} rounds "
        "(lower is better)",
        caption="Rows: each participant's own held-out episodes, then their union.",
    )
    columns = [
        ("participant", "left", None),
        ("federated", "right", final),
        ("alone (own model)", "right", None),
        (f"best site alone ({best})", "right", local.get(best) if best else None),
        ("pooled-data oracle", "right", result.final_pooled_oracle),
        ("FedAvg", "right", result.final_fedavg),
        ("federated R²", "right", None),
    ]
    for column, justify, _ in columns:
        table.add_column(column, justify=justify)  # type: ignore[arg-type]

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
            *(err(report, pid) for _, _, report in columns[3:6]),
            _num(final.get("participants", {}).get(pid, {}).get("probe_r2")),
        )
    table.add_row(
        "[bold]union of all",
        err(final, None),
        _num(summary["local_only_mean_union_k_step_error"]) + " (mean)",
        *(err(report, None) for _, _, report in columns[3:6]),
        _num(final.get("union", {}).get("probe_r2")),
        end_section=True,
    )
    out.print(table)
    for line in _verdicts(summary):
        out.print(line)
    warning = summary["divergence"]["warning"]
    if warning:
        out.print(f"[bold red]Divergence: {warning} (ledger.jsonl, field guard).")
    resumed = summary["resumed_from_version"]
    before = f", {resumed} of them before the resume" if resumed is not None else ""
    out.print(
        f"Rounds committed {summary['rounds_committed']}{before} (aborted attempts "
        f"{summary['aborted_attempts']}); bytes up {_mb(summary['bytes_up'])}, down "
        f"{_mb(summary['bytes_down'])}; wall time {result.wall_s:.1f} s."
    )
    out.print(f"Final model hash {result.model_hash}")
    out.print(f"Config hash      {result.config_hash}")
    files = ["ledger.jsonl", "metrics.jsonl", "coordinator/checkpoints/"]
    if png:
        files.append(png.name)
    out.print(f"Wrote {', '.join(str(result.output_dir / f) for f in files)}")


def _verdicts(summary: dict[str, Any]) -> list[str]:
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
        lines.append(
            f"Pooled-data oracle (no residency, same total inner steps): {oracle:.4f}, best "
            f"round {oracle_best:.4f}; federated is {fed / oracle:.2f}x / {fed / oracle_best:.2f}x "
            "it."
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
            f"Best round {peak} ({peak_err:.4f}); the final model is within "
            f"{100 * (fed / peak_err - 1):.1f}% of it."
        )
    return lines


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"
