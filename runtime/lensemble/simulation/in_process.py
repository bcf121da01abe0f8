"""The main job: a deterministic in-process federation of world-model participants.

Each participant collects its own trajectories (its own physics), keeps them in its own folder,
and trains a world model from the global parameters every round; the coordinator commits the
DiLoCo outer step. Every ``evaluation.every_rounds`` rounds and after the last one, the global
model is scored next to its baselines (:mod:`lensemble.simulation.evaluation`). Nothing
crosses the transport except model payloads and pseudo-gradients.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lensemble.config import LensembleConfig, config_hash
from lensemble.errors import RankGroupExhausted, UsageError
from lensemble.federation.coordinator import (
    Coordinator,
    CoordinatorObserver,
    RunSummary,
    global_architecture,
)
from lensemble.federation.faults import FaultPlan
from lensemble.federation.inprocess import InProcessTransport
from lensemble.federation.participant import Participant
from lensemble.learner import Learner
from lensemble.machinery.cpus import cores_given
from lensemble.run_lock import coordinator_lock
from lensemble.simulation.evaluation import Evaluation
from lensemble.simulation.output import fresh_output, read_round_metrics, recover_metrics
from lensemble.simulation.scoring import RoundScoring, rebuild_metrics
from lensemble.simulation.summary import RoundMetrics, SimulationResult
from lensemble.simulation.workers import SimulationWorkers

if TYPE_CHECKING:
    from lensemble.data.trajectories import ParticipantData
    from lensemble.federation.verify import VerifiedRecord


def run_in_process(
    config: LensembleConfig,
    *,
    faults: FaultPlan | None = None,
    resume: bool = False,
    observer: CoordinatorObserver | None = None,
    on_metrics: Callable[[RoundMetrics], None] | None = None,
    workers: int | None = None,
) -> SimulationResult:
    """Run the in-process federation described by ``config``.

    Args:
        config: The run's config (``federation.transport`` is ignored: everything runs here).
        faults: Faults to inject into the in-process transport.
        resume: Continue from the last checkpoint in ``run.output_dir`` instead of starting over
            (a fresh start removes the previous run's checkpoints, ledger and metrics, but keeps
            each participant's data cache).
        observer: Round-state callbacks (progress display).
        on_metrics: Called with each committed round's metrics.
        workers: Worker processes that train the participants and the baselines
            (:mod:`lensemble.simulation.workers`; default one per core this process is given,
            at most one per participant); 1 trains everything in this process. Any count gives
            the same hashes.

    Returns:
        The result; files ``ledger.jsonl``, ``metrics.jsonl``, checkpoints and per-participant
        state are under ``run.output_dir``.

    Raises:
        QuorumNotReached: A round stayed below quorum after every retry.
        RankGroupExhausted: A participant's rank group lost more rounds than its
            ``max_restarts``: it left, and the run finished without it (ledger and metrics
            written); raised once the run is over.
        ResidencyViolation: A participant tried to send something other than a pseudo-gradient.
        FolderLocked: Another process writes this folder's coordinator state (exit 2).
        IntegrityError: The run record to resume from is broken (exit 3, before any work).
        UsageError: The run record to resume from is signed and no key is configured (exit 2,
            before any work).
        DiskFull: The output folder's filesystem is full.
    """
    out = Path(config.run.output_dir)
    with coordinator_lock(out):
        return _run(
            config,
            out,
            faults,
            resume=resume,
            observer=observer,
            on_metrics=on_metrics,
            workers=workers,
        )


def _run(
    config: LensembleConfig,
    out: Path,
    faults: FaultPlan | None,
    *,
    resume: bool,
    observer: CoordinatorObserver | None,
    on_metrics: Callable[[RoundMetrics], None] | None,
    workers: int | None,
) -> SimulationResult:
    from lensemble.data.trajectories import load_or_collect

    start = time.perf_counter()
    verified = None
    if resume:  # verify once, before any work: collecting data can take minutes
        from lensemble.federation.signing import signer_from_env
        from lensemble.federation.verify import require_valid

        verified = require_valid(out, config.observability.ledger_path, signer_from_env())
    else:
        fresh_output(out, config.observability.ledger_path)
    out.mkdir(parents=True, exist_ok=True)
    datasets = {pid: load_or_collect(config, pid) for pid in config.participant_ids}
    check_rank_faults(config, faults)
    count = workers if workers is not None else min(len(datasets), cores_given())
    processes = _worker_processes(config, count)
    try:
        return _federate(
            config,
            out,
            start,
            datasets,
            (faults, verified, observer, on_metrics),
            resume=resume,
            workers=workers,
            processes=processes,
        )
    finally:
        if processes is not None:
            processes.close()


def _worker_processes(config: LensembleConfig, workers: int) -> SimulationWorkers | None:
    """Worker processes for the learners and the baselines; None with one worker.

    A participant with a rank group keeps its learner here: its launcher must run on this
    process's main thread.
    """
    if workers <= 1:
        return None
    single = [p for p in config.participant_ids if config.rank_layout(p).world_size == 1]
    # No more workers than jobs that keep state: each learner, each site alone, oracle, FedAvg.
    jobs = len(single) + len(config.participant_ids) + 2
    return SimulationWorkers(config, single, min(workers, jobs))


def _federate(
    config: LensembleConfig,
    out: Path,
    start: float,
    datasets: Mapping[str, ParticipantData],
    given: tuple[
        FaultPlan | None,
        VerifiedRecord | None,
        CoordinatorObserver | None,
        Callable[[RoundMetrics], None] | None,
    ],
    *,
    resume: bool,
    workers: int | None,
    processes: SimulationWorkers | None,
) -> SimulationResult:
    """The federation itself, once the data is collected (``processes``: its workers)."""
    faults, verified, observer, on_metrics = given
    coordinator, participants = _federation(
        config, out, datasets, verified, observer, remote=processes.learners if processes else {}
    )
    resumed_from = coordinator.version if resume and coordinator.version > 0 else None
    evaluation = Evaluation(config, datasets, workers=workers, processes=processes)
    if resume:
        for p in participants.values():
            p.restore(coordinator.version)
        recover_metrics(
            out,
            coordinator.earlier,
            coordinator.version,
            lambda record: rebuild_metrics(config, out, evaluation, record),
        )
    # Learners in worker processes: a thread per participant only waits on its pipe.
    transport = InProcessTransport(
        participants, faults, workers=len(participants) if processes else workers
    )
    scoring = RoundScoring(config, out, evaluation, coordinator, on_metrics)
    ran = coordinator.run(transport, after_commit=scoring.committed)
    _raise_if_left(transport, out)
    scored = scoring.final()
    final, kept = kept_final(ran, scored.federated, evaluation)
    return SimulationResult(
        config_hash=config_hash(config),
        # The whole run, including what came before a resume (the ledger's lines).
        records=coordinator.history,
        metrics=scoring.metrics,
        model_hash=kept["model_hash"] if kept else coordinator.model_hash,
        final=final,
        final_local_only=scored.local_only or {},
        final_pooled_oracle=scored.pooled_oracle,
        final_fedavg=scored.fedavg,
        output_dir=out,
        wall_s=time.perf_counter() - start,
        resumed_from=resumed_from,
        history=read_round_metrics(out),  # with the rounds before a resume: the best rounds
        stopped=ran.stopped,
        kept=kept,
    )


def kept_final(
    ran: RunSummary, last: dict[str, Any] | None, evaluation: Evaluation
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The final model's scores and, under ``federation.final_model: best_reported``, its choice.

    Args:
        ran: What the coordinator's run returned (``kept`` set under ``best_reported``).
        last: The last committed version's scores.
        evaluation: Scores another version when the run keeps one.

    Returns:
        ``(scores, choice)``: the last version's scores and None under ``last``; else the kept
        version's scores (the last one's when it is the last) and
        :meth:`~lensemble.federation.keep_best.FinalChoice.to_dict`.
    """
    if ran.kept is None:
        return last, None
    choice = ran.kept.choice
    scores = last if choice.version == choice.last else evaluation.federated(ran.kept.params)
    return scores, choice.to_dict()


def _federation(
    config: LensembleConfig,
    out: Path,
    datasets: Mapping[str, ParticipantData],
    verified: VerifiedRecord | None,
    observer: CoordinatorObserver | None,
    *,
    remote: Mapping[str, Learner],
) -> tuple[Coordinator, dict[str, Participant]]:
    """The coordinator (resuming ``verified`` when given) and every participant.

    A participant in ``remote`` trains with that learner (in a worker process); the others
    with one built here.
    """
    from lensemble.model.inner_loop import initial_global_parameters
    from lensemble.ranks.learner import learner_for

    theta0 = initial_global_parameters(config)
    arch = global_architecture(theta0)
    participants = {
        pid: Participant(
            config, pid, remote.get(pid) or learner_for(config, pid, datasets[pid]), arch, out
        )
        for pid in config.participant_ids
    }
    resume = verified if verified is not None else False
    coordinator = Coordinator(config, theta0, output_dir=out, resume=resume, observer=observer)
    return coordinator, participants


def _raise_if_left(transport: InProcessTransport, out: Path) -> None:
    """Fail the finished run when a participant left it (its rank group was exhausted).

    Raises:
        RankGroupExhausted: As over the network, where that participant's process exits
            non-zero after saying Leave: the run finished without it, and the command fails.
    """
    if transport.left:
        exc = transport.left[min(transport.left)]
        raise RankGroupExhausted(
            f"{exc.message} it left the run, which finished without it (ledger in {out});",
            remediation=exc.remediation,
        )


def check_rank_faults(config: LensembleConfig, faults: FaultPlan | None) -> None:
    """Refuse a ``rank_kill`` fault aimed at a rank the participant does not have.

    Raises:
        UsageError: The target participant has fewer ranks than the fault names.
    """
    for fault in faults.faults if faults else ():
        if fault.kind != "rank_kill" or fault.participant is None:
            continue
        ranks = config.rank_layout(fault.participant).world_size
        rank = int(fault.value or 1)
        if rank >= ranks:
            raise UsageError(
                f"--faults rank_kill names rank {rank} of '{fault.participant}', which has "
                f"{ranks} rank(s);",
                remediation="give it more ranks (federation.participants[i].ranks) or name a "
                "lower rank.",
            )
