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
from lensemble.federation.coordinator import Coordinator, CoordinatorObserver
from lensemble.federation.faults import FaultPlan
from lensemble.federation.inprocess import InProcessTransport
from lensemble.federation.participant import Participant
from lensemble.federation.payload import manifest
from lensemble.simulation.evaluation import Evaluation
from lensemble.simulation.output import append_metrics, fresh_output, keep_metrics_before
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
        ResidencyViolation: A participant tried to send something other than a pseudo-gradient.
    """
    from lensemble.data.trajectories import load_or_collect
    from lensemble.model.inner_loop import WorldModelLearner, initial_global_parameters

    start = time.perf_counter()
    out = Path(config.run.output_dir)
    if not resume:
        fresh_output(out, config.observability.ledger_path)
    out.mkdir(parents=True, exist_ok=True)
    ids = config.participant_ids
    datasets = {pid: load_or_collect(config, pid) for pid in ids}
    theta0 = initial_global_parameters(config)
    arch = manifest(theta0)
    participants = {
        pid: Participant(config, pid, WorldModelLearner(config, pid, datasets[pid]), arch, out)
        for pid in ids
    }
    coordinator = Coordinator(config, theta0, output_dir=out, resume=resume, observer=observer)
    resumed_from = coordinator.version if resume and coordinator.version > 0 else None
    if resume:
        for p in participants.values():
            p.restore(coordinator.version)
        keep_metrics_before(out, coordinator.version)
    transport = InProcessTransport(participants, faults)
    evaluation = Evaluation(config, datasets)
    fed, ev = config.federation, config.evaluation
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
    )
