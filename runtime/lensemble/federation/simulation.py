"""The main job: a deterministic in-process federation of world-model participants.

Each participant collects its own trajectories (its own physics), keeps them in its own folder,
and trains a world model from the global parameters every round; the coordinator commits the
DiLoCo outer step. Next to the federation, each participant also trains alone for the same number
of inner steps (the local-only baseline), so every evaluation shows what federation buys:
the held-out k-step error and probe R^2 of the global model versus each local-only model, per
participant and on the union of all participants' held-out episodes.

Evaluation reads every participant's held-out episodes, which only the simulation harness may do:
it stands for each participant evaluating inside its own trust domain. Nothing here crosses the
transport except model payloads and pseudo-gradients.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lensemble.config import LensembleConfig, config_hash
from lensemble.federation.coordinator import Coordinator, CoordinatorObserver
from lensemble.federation.faults import FaultPlan
from lensemble.federation.inprocess import InProcessTransport
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.participant import Participant
from lensemble.federation.payload import manifest


@dataclass
class RoundMetrics:
    """One line of ``metrics.jsonl``: the round's lineage summary and held-out scores."""

    round: int
    model_hash: str
    contributors: list[str]
    mean_inner_loss: float | None
    bytes_up: int
    bytes_down: int
    wall_s: float
    non_compute_s: float
    federated: dict[str, Any] | None = None
    local_only: dict[str, dict[str, Any]] | None = None

    def to_json(self) -> str:
        """Compact JSON line."""
        return json.dumps(self.__dict__, sort_keys=True, separators=(",", ":"))


@dataclass
class SimulationResult:
    """Everything ``lensemble simulate`` reports.

    Attributes:
        config_hash: Hash of the config that ran.
        records: Ledger records of this process (every attempt).
        metrics: One entry per committed round of this process.
        model_hash: Hash of the final global model.
        final: Final evaluation of the global model (``EvalReport.to_dict()``).
        final_local_only: Final evaluation of each local-only model, by participant.
        output_dir: Where files were written.
        wall_s: Wall time of this process (seconds).
        resumed_from: Model version (rounds committed before) this process resumed from; None
            for a run from the start. ``records`` then cover the whole run, both parts.
    """

    config_hash: str
    records: list[RoundRecord]
    metrics: list[RoundMetrics]
    model_hash: str
    final: dict[str, Any] | None
    final_local_only: dict[str, dict[str, Any]] = field(default_factory=dict)
    output_dir: Path = Path()
    wall_s: float = 0.0
    resumed_from: int | None = None


def fresh_output(out: Path, ledger_path: str = "ledger.jsonl") -> None:
    """Remove a previous run's coordinator state, ledger, metrics and inner states.

    Each participant's data cache (``participants/<id>/data``) and any certificates are kept.
    """
    shutil.rmtree(out / "coordinator", ignore_errors=True)
    for name in (ledger_path, "metrics.jsonl", "report.png"):
        (out / name).unlink(missing_ok=True)
    for folder in (out / "participants").glob("*/state"):
        shutil.rmtree(folder, ignore_errors=True)


def run_simulation(
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
    from lensemble.eval.heldout import evaluate
    from lensemble.model.learner import WorldModelLearner, initial_global_parameters

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
    transport = InProcessTransport(participants, faults)

    # Local-only baseline: each participant alone, same inner steps per committed round.
    fed, ev = config.federation, config.evaluation
    baseline = {pid: WorldModelLearner(config, pid, datasets[pid]) for pid in ids}
    baseline_params = {pid: {k: v.clone() for k, v in theta0.items()} for pid in ids}

    def baseline_step(round_index: int) -> None:
        for pid in ids:
            local = baseline[pid].train_round(baseline_params[pid], round_index, fed.inner_steps)
            baseline_params[pid] = local.params

    if ev.local_only_baseline:
        for t in range(coordinator.version):  # catch up after a resume (deterministic)
            baseline_step(t)

    metrics_file = out / "metrics.jsonl"
    if resume and metrics_file.exists():
        kept = [
            line
            for line in metrics_file.read_text(encoding="utf-8").splitlines()
            if json.loads(line)["round"] < coordinator.version
        ]
        metrics_file.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    metrics: list[RoundMetrics] = []
    final: dict[str, Any] | None = None
    final_local: dict[str, dict[str, Any]] = {}
    while coordinator.version < fed.rounds:
        record = coordinator.run_round(transport)
        if ev.local_only_baseline:
            baseline_step(record.round)
        line = RoundMetrics(
            round=record.round,
            model_hash=record.model_hash,
            contributors=record.contributors,
            mean_inner_loss=record.mean_inner_loss,
            bytes_up=record.bytes_up,
            bytes_down=record.bytes_down,
            wall_s=record.wall_s,
            non_compute_s=record.non_compute_s,
        )
        last = coordinator.version == fed.rounds
        if last or (record.round + 1) % ev.every_rounds == 0:
            final = evaluate(config, coordinator.params, datasets).to_dict()
            line.federated = final
            if ev.local_only_baseline:
                final_local = {
                    pid: evaluate(config, baseline_params[pid], datasets).to_dict() for pid in ids
                }
                line.local_only = final_local
        with metrics_file.open("a", encoding="utf-8") as f:
            f.write(line.to_json() + "\n")
        metrics.append(line)
        if on_metrics is not None:
            on_metrics(line)
    transport.finish()
    if final is None:  # resumed a finished run: evaluate what is there
        final = evaluate(config, coordinator.params, datasets).to_dict()
    return SimulationResult(
        config_hash=config_hash(config),
        # The ledger holds the whole run, including what came before a resume.
        records=coordinator.ledger.records() if coordinator.ledger else coordinator.records,
        metrics=metrics,
        model_hash=coordinator.model_hash,
        final=final,
        final_local_only=final_local,
        output_dir=out,
        wall_s=time.perf_counter() - start,
        resumed_from=resumed_from,
    )


def read_metrics(out: Path) -> list[dict[str, Any]]:
    """Every line of ``metrics.jsonl`` (for plots and reports)."""
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def mean_local_only_union(local_only: dict[str, dict[str, Any]] | None) -> float | None:
    """Mean over participants of each local-only model's k-step error on the union."""
    if not local_only:
        return None
    values = [float(r["union"]["k_step_error"]) for r in local_only.values()]
    return sum(values) / len(values)
