"""A federation as local processes: ``lensemble simulate`` over the network transport, TLS on.

The launcher issues development certificates into ``<output_dir>/certs`` (and bearer tokens when
``network.auth`` is ``token``), starts one coordinator and one participant process per
participant with the same config file and overrides, waits for every ready line, follows the
coordinator's round events, and summarises the run from the ledger exactly as the in-process
run does: the hash chain, bytes, the final model hash and, when the world model is available,
the held-out evaluation of the final model next to the local-only baseline
(:mod:`lensemble.simulation.evaluation`).

Faults: a participant process applies ``rank_kill``, ``misreport`` and the estimating attacks to
itself (``lensemble participant --faults``), so a plan of such faults plays out as in process
and commits the same ledger; the other kinds are the in-process transport's and are refused
here.

Any process that fails stops the run: the launcher reports one sentence naming the process and
its last error, tears every process down exactly once, and raises ``ProcessFailed``.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lensemble.config import LensembleConfig, config_hash
from lensemble.federation.checkpoint import CheckpointStore, CoordinatorCheckpoint
from lensemble.federation.faults import FaultPlan
from lensemble.federation.final_model import KeptModel, kept_in_record
from lensemble.federation.ledger import Ledger, RoundRecord
from lensemble.federation.signing import signer_from_env
from lensemble.federation.verify import require_valid
from lensemble.machinery.cpus import cores_given
from lensemble.network.launch.launcher import (
    LENSEMBLE_PROGRAM,
    LocalFederation,
    ManagedProcess,
    ProcessFailed,
    free_port,
)
from lensemble.network.shared.certs import init_certs
from lensemble.network.shared.identity import COORDINATOR_IDENTITY
from lensemble.run_lock import coordinator_lock
from lensemble.simulation.evaluation import Evaluation
from lensemble.simulation.output import fresh_output, write_metrics
from lensemble.simulation.summary import RoundMetrics, SimulationResult
from lensemble.simulation.workers import SimulationWorkers

#: Extra time (seconds) for process start-up (imports) on top of the config's own timeouts.
STARTUP_S = 120.0


def security_overrides(config: LensembleConfig, out: Path) -> list[str]:
    """Issue development credentials under ``out/certs`` and point the config at them."""
    net = config.network
    overrides: list[str] = []
    certs = out / "certs"
    if net.tls.enabled:
        init_certs(certs, config)
        overrides += [
            f"network.tls.ca_file={certs / 'ca.crt'}",
            f"network.tls.cert_file={certs / '{identity}' / 'tls.crt'}",
            f"network.tls.key_file={certs / '{identity}' / 'tls.key'}",
        ]
    if net.auth == "token":
        folder = certs / "tokens"
        folder.mkdir(parents=True, exist_ok=True)
        tokens = {pid: secrets.token_urlsafe(32) for pid in config.participant_ids}
        lines = "".join(f"{pid} {token}\n" for pid, token in tokens.items())
        _write_secret(folder / COORDINATOR_IDENTITY, lines)
        for pid, token in tokens.items():
            _write_secret(folder / pid, token + "\n")
        overrides.append(f"network.token_file={folder / '{identity}'}")
    return overrides


def _write_secret(path: Path, text: str) -> None:
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(text, encoding="utf-8")


def run_local_processes(
    config_path: Path,
    overrides: Sequence[str],
    config: LensembleConfig,
    *,
    resume: bool = False,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    program: Sequence[str] = LENSEMBLE_PROGRAM,
    evaluate_final: bool = True,
    faults: FaultPlan | None = None,
) -> SimulationResult:
    """Run the federation as separate processes on this machine and summarise it.

    Args:
        config_path: The config file (every process reads it).
        overrides: The ``--set`` overrides the config was loaded with.
        config: The loaded config (``federation.transport`` is ``network``).
        resume: Keep the previous run's state (the coordinator resumes from its checkpoint);
            otherwise it is removed first, data caches excepted.
        on_round: Called with each ``round_closed`` event of the coordinator.
        program: The command the processes run (``lensemble`` by default).
        evaluate_final: Evaluate the final model on the participants' held-out episodes (the
            world model); off for other learners.
        faults: Faults to inject; only kinds a participant applies to itself
            (``fault_kinds.PARTICIPANT_KINDS``: ``rank_kill``, ``misreport``, the estimating
            attacks), the whole plan handed to every participant process as ``--faults``.

    Returns:
        The run's summary (evaluation of the final model when the world model is available).

    Raises:
        UsageError: ``faults`` holds a kind only the in-process transport injects.
        ProcessFailed: A process failed or never became ready; names it and its last error.
    """
    plan = faults or FaultPlan()
    plan.require_participant_kinds(
        "over the network only rank_kill, misreport and the estimating attacks apply (a "
        "participant process applies them to itself); drop the others or simulate in process."
    )
    start = time.perf_counter()
    out = Path(config.run.output_dir)
    # The coordinator process takes the coordinator lock; here it only guards the clean-up.
    resumed_from = None
    with coordinator_lock(out):
        if resume:
            ledger, signer = config.observability.ledger_path, signer_from_env()
            verified = require_valid(out, ledger, signer, keep_tensors=False)
            before = verified.report.checkpoints
            resumed_from = before[-1] if before and before[-1] > 0 else None
        else:
            fresh_output(out, config.observability.ledger_path)
    launch = [*overrides, *security_overrides(config, out), *_loopback_overrides(config)]
    with LocalFederation(config_path, launch, out / "logs", program=program) as processes:
        coordinator = processes.start_coordinator()
        participants = [
            # The whole plan: each process applies its own entries, and an attack's f counts
            # every attacker of the plan (faults.participant_faults).
            processes.start_participant(pid, extra_args=_fault_args(plan))
            for pid in config.participant_ids
        ]
        everyone = [coordinator, *participants]
        for proc in everyone:
            _ready_or_fail(proc, everyone, STARTUP_S + config.federation.join_timeout_s)
        stopped = _follow(coordinator, participants, on_round)
        _wait_participants(participants, config.network.rpc_timeout_s + 10)
    records = Ledger(out / config.observability.ledger_path).records()
    wall_s = time.perf_counter() - start
    return _summarise(
        config,
        out,
        records,
        wall_s,
        evaluate_final=evaluate_final,
        resumed_from=resumed_from,
        stopped=stopped,
    )


def _loopback_overrides(config: LensembleConfig) -> list[str]:
    """Free loopback ports for the coordinator (and its model download port), JSON logs."""
    return [
        f"network.port={free_port()}",
        # The model download port too, unless the config turned it off.
        *([] if config.network.download_port is None else [f"network.download_port={free_port()}"]),
        "network.host=127.0.0.1",
        "network.listen_host=127.0.0.1",
        "observability.log_format=json",
    ]


def _wait_participants(participants: list[ManagedProcess], timeout_s: float) -> None:
    """Wait for every participant to exit after the run; stop one that outstays it.

    Raises:
        ProcessFailed: A participant exited non-zero (names it and its last error).
    """
    for proc in participants:
        try:
            code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:  # it outstays the run: stop it
            code = proc.stop(5.0)
        if code != 0:
            raise ProcessFailed(
                f"participant {proc.identity} exited with code {code} after the run: "
                f"{proc.last_error().rstrip('.; ')};",
                remediation=f"see {proc.log_path}.",
            )


def _fault_args(plan: FaultPlan) -> list[str]:
    """The ``--faults`` arguments of a participant process (none without faults)."""
    return ["--faults", plan.spec()] if plan.faults else []


def _ready_or_fail(proc: ManagedProcess, everyone: list[ManagedProcess], timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while True:
        failed = [p for p in everyone if p.returncode not in (None, 0)]
        if failed:
            first = failed[0]
            raise ProcessFailed(
                f"{first.identity} exited with code {first.returncode} before the run started: "
                f"{first.last_error()}",
                remediation=f"see {first.log_path}.",
            )
        try:
            proc.wait_ready(min(1.0, max(0.0, end - time.monotonic())))
            return
        except ProcessFailed:
            if proc.returncode is None and time.monotonic() >= end:
                raise


def _follow(
    coordinator: ManagedProcess,
    participants: list[ManagedProcess],
    on_round: Callable[[dict[str, Any]], None] | None,
) -> str | None:
    """Report round events until the coordinator exits; fail fast if any process fails.

    Returns:
        Why the coordinator ended its run before ``federation.rounds`` (the ``reason`` of its
        ``stopped_early`` event), or None.
    """
    seen = 0
    while True:
        code = coordinator.returncode
        # After the exit, every event the coordinator logged (its stderr drained).
        events = coordinator.all_events()[seen:]
        seen += len(events)
        for item in events:
            if item.get("event") == "round_closed" and on_round is not None:
                on_round(item)
        if code is not None:
            if code != 0:
                raise ProcessFailed(
                    f"the coordinator exited with code {code}: {coordinator.last_error()}",
                    remediation=f"see {coordinator.log_path}.",
                )
            stops = [e for e in coordinator.events if e.get("event") == "stopped_early"]
            return str(stops[-1].get("reason", "")) if stops else None
        for proc in participants:
            if proc.returncode not in (None, 0):
                raise ProcessFailed(
                    f"participant {proc.identity} exited with code {proc.returncode}: "
                    f"{proc.last_error()}",
                    remediation=f"see {proc.log_path}.",
                )
        time.sleep(0.2)


def _summarise(
    config: LensembleConfig,
    out: Path,
    records: list[RoundRecord],
    wall_s: float,
    *,
    evaluate_final: bool,
    resumed_from: int | None,
    stopped: str | None,
) -> SimulationResult:
    checkpoint = CheckpointStore(out).load()
    committed = [r for r in records if r.state == "closed"]
    metrics = [RoundMetrics.of(r) for r in committed]
    scored = RoundMetrics(-1, "", [], None, 0, 0, 0.0, 0.0)
    kept = None
    if checkpoint is not None:
        kept = kept_in_record(config.federation, committed, CheckpointStore(out), checkpoint)
    if checkpoint is not None and evaluate_final:
        scored = metrics[-1] if metrics else scored
        # The baselines train as many rounds as the model has (not ledger lines: a resume may
        # have recorded a round's commit twice).
        # The run is over: its baselines train in worker processes, one per core.
        cores = cores_given()
        processes = SimulationWorkers(config, (), cores) if cores > 1 else None
        try:
            evaluation = Evaluation(config, processes=processes)
            evaluation.score(scored, checkpoint.params, checkpoint.version)
            if kept is not None and kept.choice.version != checkpoint.version:
                scored.federated = evaluation.federated(kept.params)
        finally:
            if processes is not None:
                processes.close()
    write_metrics(out, metrics)
    return SimulationResult(
        config_hash=config_hash(config),
        records=records,
        metrics=metrics,
        model_hash=_final_hash(kept, checkpoint),
        final=scored.federated,
        final_local_only=scored.local_only or {},
        final_pooled_oracle=scored.pooled_oracle,
        final_fedavg=scored.fedavg,
        output_dir=out,
        wall_s=wall_s,
        resumed_from=resumed_from,
        stopped=stopped,
        kept=kept.choice.to_dict() if kept is not None else None,
    )


def _final_hash(kept: KeptModel | None, checkpoint: CoordinatorCheckpoint | None) -> str:
    """The hash of the model the run ends with: the kept version's, else the last one's."""
    if kept is not None:
        return kept.choice.model_hash
    return checkpoint.model_hash if checkpoint is not None else ""
