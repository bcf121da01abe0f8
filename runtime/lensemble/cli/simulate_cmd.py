"""``lensemble simulate``: the main job, a federation of N participants on this machine."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from lensemble.cli.options import SetOption, load
from lensemble.errors import Interrupted, LensembleError, UsageError
from lensemble.federation.fault_kinds import faults_help

if TYPE_CHECKING:
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
        None, help="Config file (default: config/local.yaml).", metavar="CONFIG"
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
    faults: str = typer.Option("", "--faults", metavar="SPEC", help=faults_help()),
    json_summary: bool = typer.Option(
        False, "--json", help="Print a JSON summary on stdout instead of the tables."
    ),
    workers: int | None = typer.Option(
        None,
        "--workers",
        min=1,
        help="Worker processes that train the participants and the baselines (default: one "
        "per core this process is given). Any count commits the same hashes; 1 trains "
        "everything in this process, one after another.",
    ),
) -> None:
    """Train a world model with DiLoCo across the config's participants, deterministically.

    Writes ledger.jsonl, metrics.jsonl, checkpoints and report.png under the output folder and
    prints the held-out error of the federated model next to each participant training alone,
    the best of them, the pooled-data oracle and the FedAvg ablation.
    """
    from lensemble.cli.output import require_folder
    from lensemble.config import default_config_path
    from lensemble.federation.faults import parse_faults

    require_folder(output_dir, "--output-dir")
    overrides = _overrides(set_, participants, rounds, output_dir)
    cfg = load(config or default_config_path(), overrides)
    plan = parse_faults(faults, cfg.participant_ids)
    _check_faults(cfg, plan)  # before the output folder is touched
    try:
        result = _run(cfg, config or default_config_path(), overrides, resume, plan, workers)
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
    from lensemble.cli.progress import plural
    from lensemble.federation.fault_kinds import PARTICIPANT_KINDS

    late = [f for f in plan.faults if f.round_index >= cfg.federation.rounds]
    if late:
        raise UsageError(
            f"--faults targets round {late[0].round_index}, but the run has "
            f"{plural(cfg.federation.rounds, 'round')} (0 to {cfg.federation.rounds - 1});",
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
    cfg: LensembleConfig,
    config: Path,
    overrides: list[str],
    resume: bool,
    plan: FaultPlan,
    workers: int | None,
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
        return _run_with_progress(cfg, plan, resume, workers)


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
        from lensemble.cli.run_summary import print_summary

        print_summary(cfg, result, png)


def _run_with_progress(
    cfg: LensembleConfig, plan: Any, resume: bool, workers: int | None
) -> SimulationResult:
    from lensemble.cli.progress import plural, round_line, round_progress
    from lensemble.federation.rounds import RoundState
    from lensemble.simulation.in_process import run_in_process

    fed = cfg.federation
    sys.stderr.write(
        f"lensemble simulate: {plural(len(fed.participants), 'participant')}, "
        f"{plural(fed.rounds, 'round')} x {plural(fed.inner_steps, 'inner step')}, "
        f"{cfg.data.env_id}, quantization {fed.quantization} -> {cfg.run.output_dir}\n"
    )
    progress = round_progress(fed.rounds)

    class Observer:
        def on_state(self, round_index: int, attempt: int, state: RoundState) -> None:
            if state == RoundState.OPEN:
                progress.opened(round_index, attempt)

        def on_verdict(self, submission: Any, verdict: Any) -> None:
            if not verdict.accepted:
                progress.note(
                    f"round {submission.round_index}: rejected {submission.sender}: "
                    f"{verdict.reason} ({verdict.message})"
                )

        def on_round(self, record: Any) -> None:
            for note in rank_failure_notes(
                record.round, record.attempt, record.state, record.excluded, fed.rounds
            ):
                progress.note(note)
            line = round_line(
                record.round,
                record.attempt,
                record.state,
                record.contributors,
                len(fed.participants),
                quorum=fed.quorum,
                excluded=record.excluded if record.state == "aborted" else None,
                mean_inner_loss=record.mean_inner_loss,
                bytes_up=record.bytes_up,
                bytes_down=record.bytes_down,
                defences=record.defences,
            )
            committed = record.round + (1 if record.state == "closed" else 0)
            progress.closed(committed, line)

    with progress:
        return run_in_process(cfg, faults=plan, resume=resume, observer=Observer(), workers=workers)


def _run_network(
    cfg: LensembleConfig, path: Path, overrides: list[str], resume: bool, plan: Any
) -> SimulationResult:
    """Coordinator and participants as processes on loopback (simulation.local_processes)."""
    from lensemble.cli.progress import LineProgress, plural, round_line
    from lensemble.federation.payload import manifest
    from lensemble.model.inner_loop import initial_global_parameters
    from lensemble.network.shared.payload_limits import payload_limits
    from lensemble.simulation.local_processes import run_local_processes

    # A message cap below the model's wire size is refused here (exit 2), before any process.
    payload_limits(cfg, manifest(initial_global_parameters(cfg)))
    fed = cfg.federation
    sys.stderr.write(
        f"lensemble simulate (network transport, TLS "
        f"{'on' if cfg.network.tls.enabled else 'off'}, auth {cfg.network.auth}): 1 coordinator "
        f"and {plural(len(fed.participants), 'participant process', 'participant processes')}, "
        f"{plural(fed.rounds, 'round')} -> {cfg.run.output_dir} (logs in "
        f"{Path(cfg.run.output_dir) / 'logs'})\n"
    )
    # The coordinator's round events arrive as it logs them: one line each, bar or not.
    progress = LineProgress(fed.rounds, sys.stderr)

    def on_round(event: dict[str, Any]) -> None:
        round_index, state = int(event.get("round", 0)), str(event.get("state", ""))
        excluded = event.get("excluded") or {}
        for note in rank_failure_notes(
            round_index, int(event.get("attempt", 0)), state, excluded, fed.rounds
        ):
            progress.note(note)
        line = round_line(
            round_index,
            int(event.get("attempt", 0)),
            state,
            list(event.get("contributors", [])),
            len(fed.participants),
            quorum=fed.quorum,
            excluded=excluded or None,
            bytes_up=event.get("bytes_up"),
            bytes_down=event.get("bytes_down"),
            defences={"clipped": event.get("clipped"), "set_aside": event.get("set_aside")},
        )
        model = str(event.get("model_hash", ""))[:19]
        progress.closed(round_index + (state == "closed"), f"{line}, model {model}...")

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
