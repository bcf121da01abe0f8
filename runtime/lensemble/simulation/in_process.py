"""The main job: a deterministic in-process federation of world-model participants.

Each participant collects its own trajectories (its own physics), keeps them in its own folder,
and trains a world model from the global parameters every round; the coordinator commits the
DiLoCo outer step. Every ``evaluation.every_rounds`` rounds and after the last one, the global
model is scored next to its baselines (:mod:`lensemble.simulation.evaluation`). Nothing
crosses the transport except model payloads and pseudo-gradients.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from lensemble.config import LensembleConfig, config_hash
from lensemble.errors import RankGroupExhausted, UsageError
from lensemble.federation.checkpoint import CheckpointStore
from lensemble.federation.coordinator import (
    Coordinator,
    CoordinatorObserver,
    global_architecture,
)
from lensemble.federation.faults import FaultPlan
from lensemble.federation.inprocess import InProcessTransport
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.participant import Participant
from lensemble.run_lock import coordinator_lock
from lensemble.simulation.evaluation import Evaluation
from lensemble.simulation.output import (
    append_metrics,
    fresh_output,
    read_round_metrics,
    recover_metrics,
)
from lensemble.simulation.summary import RoundMetrics, SimulationResult


def run_in_process(
    config: LensembleConfig,
    *,
    faults: FaultPlan | None = None,
    resume: bool = False,
    observer: CoordinatorObserver | None = None,
    on_metrics: Callable[[RoundMetrics], None] | None = None,
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
        return _run(config, out, faults, resume=resume, observer=observer, on_metrics=on_metrics)


def _run(
    config: LensembleConfig,
    out: Path,
    faults: FaultPlan | None,
    *,
    resume: bool,
    observer: CoordinatorObserver | None,
    on_metrics: Callable[[RoundMetrics], None] | None,
) -> SimulationResult:
    from lensemble.data.trajectories import load_or_collect
    from lensemble.model.inner_loop import initial_global_parameters
    from lensemble.ranks.learner import learner_for

    start = time.perf_counter()
    if resume:  # verify before any work: collecting data can take minutes
        from lensemble.federation.signing import signer_from_env
        from lensemble.federation.verify import require_valid

        require_valid(out, config.observability.ledger_path, signer_from_env())
    else:
        fresh_output(out, config.observability.ledger_path)
    out.mkdir(parents=True, exist_ok=True)
    ids = config.participant_ids
    datasets = {pid: load_or_collect(config, pid) for pid in ids}
    theta0 = initial_global_parameters(config)
    arch = global_architecture(theta0)
    check_rank_faults(config, faults)
    participants = {
        pid: Participant(config, pid, learner_for(config, pid, datasets[pid]), arch, out)
        for pid in ids
    }
    coordinator = Coordinator(config, theta0, output_dir=out, resume=resume, observer=observer)
    resumed_from = coordinator.version if resume and coordinator.version > 0 else None
    evaluation = Evaluation(config, datasets)
    fed, ev = config.federation, config.evaluation
    if resume:
        for p in participants.values():
            p.restore(coordinator.version)
        assert coordinator.ledger is not None
        recover_metrics(
            out,
            coordinator.ledger.records(),
            coordinator.version,
            lambda record: rebuild_metrics(config, out, evaluation, record),
        )
    transport = InProcessTransport(participants, faults)
    metrics: list[RoundMetrics] = []
    scored: RoundMetrics | None = None
    while coordinator.version < fed.rounds:
        record = coordinator.run_round(transport)
        line = RoundMetrics.of(record)
        last = coordinator.version == fed.rounds
        if last or (record.round + 1) % ev.every_rounds == 0:
            evaluation.score(line, coordinator.params, coordinator.version)
            scored = line
        append_metrics(out, line)
        metrics.append(line)
        if on_metrics is not None:
            on_metrics(line)
    transport.finish()
    if transport.left:
        # As over the network, where that participant's process exits non-zero after saying
        # Leave: the run finished without it, and the command says so and fails.
        exc = transport.left[min(transport.left)]
        raise RankGroupExhausted(
            f"{exc.message} it left the run, which finished without it (ledger in {out});",
            remediation=exc.remediation,
        )
    if scored is None:  # resumed a finished run: evaluate what is there
        scored = RoundMetrics(coordinator.version - 1, coordinator.model_hash, [], None, 0, 0, 0, 0)
        evaluation.score(scored, coordinator.params, coordinator.version)
    return SimulationResult(
        config_hash=config_hash(config),
        # The ledger holds the whole run, including what came before a resume.
        records=coordinator.ledger.records() if coordinator.ledger else coordinator.records,
        metrics=metrics,
        model_hash=coordinator.model_hash,
        final=scored.federated,
        final_local_only=scored.local_only or {},
        final_pooled_oracle=scored.pooled_oracle,
        final_fedavg=scored.fedavg,
        output_dir=out,
        wall_s=time.perf_counter() - start,
        resumed_from=resumed_from,
        history=read_round_metrics(out),  # with the rounds before a resume: the best rounds
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


def _evaluated(config: LensembleConfig, round_index: int) -> bool:
    """Whether the metrics line of ``round_index`` carries held-out scores."""
    last = round_index + 1 == config.federation.rounds
    return last or (round_index + 1) % config.evaluation.every_rounds == 0


def rebuild_metrics(
    config: LensembleConfig, out: Path, evaluation: Evaluation, record: RoundRecord
) -> RoundMetrics:
    """The metrics line of a committed round a crash lost, scored as the lost line was.

    An evaluated round gets every field a line written at the time has: the global model's
    scores from its checkpoint, and every enabled baseline's (local-only, pooled oracle,
    FedAvg), trained again up to that round from the config and seed, which gives the same
    values. Should the round's checkpoint be gone (pruned; a crash loses only the newest
    round's line, whose checkpoint is kept), the global model cannot be scored again: the line
    then says why in ``unscored`` and the report leaves a gap there.

    Args:
        config: The run's config (``evaluation``, ``federation.rounds``).
        out: The run folder (its checkpoints).
        evaluation: The run's evaluation; its baselines train on up to the round (rounds
            already trained are not repeated), so call this in round order.
        record: The committed round's ledger record.

    Returns:
        The line: the record's lineage, and on an evaluated round its scores.

    Raises:
        IntegrityError: The round's checkpoint is corrupt (the resume verified it just before).
    """
    line = RoundMetrics.of(record)
    if not _evaluated(config, record.round):
        return line
    version = record.round + 1
    store = CheckpointStore(out)
    if version in store.versions():
        ckpt = store.load(version)
        assert ckpt is not None
        evaluation.score(line, ckpt.params, version)
    else:
        evaluation.score_baselines(line, version)
        line.unscored = (
            f"rebuilt on resume after checkpoint v{version} was pruned: the global model of "
            f"round {record.round} could not be scored again"
        )
    return line
