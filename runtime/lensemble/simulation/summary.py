"""What a run on one machine reports: round metrics, the result, and its JSON summary."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from lensemble.federation.guard import summary as divergence_summary
from lensemble.federation.ledger import RoundRecord, committed_chain

# The fields of RoundMetrics that hold held-out scores rather than the ledger's lineage.
_SCORES = ("federated", "local_only", "pooled_oracle", "fedavg", "unscored")


@dataclass
class RoundMetrics:
    """One line of ``metrics.jsonl``: the round's lineage summary and held-out scores.

    Attributes:
        round: 0-based round index.
        model_hash: Hash of the global model the round committed.
        contributors: Participant ids whose pseudo-gradients were averaged, sorted.
        mean_inner_loss: Mean inner training loss over contributors (unitless); None if unknown.
        bytes_up: Pseudo-gradient bytes received by the coordinator (bytes).
        bytes_down: Model bytes sent to participants (bytes).
        wall_s: Wall time of the round (seconds).
        non_compute_s: Wall time not spent in inner steps (seconds).
        federated: Held-out scores of the global model (``EvalReport.to_dict()``) on an
            evaluated round, else None.
        local_only: Held-out scores of each local-only model, by participant, on an evaluated
            round with the baseline on, else None.
        pooled_oracle: Held-out scores of the pooled-data oracle on an evaluated round with it
            on, else None.
        fedavg: Held-out scores of the FedAvg ablation on an evaluated round with it on, else
            None.
        unscored: Why an evaluated round has no ``federated`` scores: set only on a line rebuilt
            on resume whose checkpoint was already pruned (the baselines are still scored);
            None otherwise. The report leaves a gap at such a round.
    """

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
    pooled_oracle: dict[str, Any] | None = None
    fedavg: dict[str, Any] | None = None
    unscored: str | None = None

    @classmethod
    def of(cls, record: RoundRecord) -> RoundMetrics:
        """The metrics line of a committed round's ledger record, not yet evaluated."""
        # Every field but the scores is the ledger record's field of the same name.
        lineage = [f.name for f in fields(cls) if f.name not in _SCORES]
        return cls(**{name: getattr(record, name) for name in lineage})

    def to_json(self) -> str:
        """Compact JSON line, keys sorted."""
        return json.dumps(self.__dict__, sort_keys=True, separators=(",", ":"))


@dataclass
class SimulationResult:
    """Everything ``lensemble simulate`` reports.

    Attributes:
        config_hash: Hash of the config that ran.
        records: Ledger records of the run (every attempt), including rounds committed before a
            resume.
        metrics: One entry per committed round of this process.
        model_hash: Hash of the final global model ("" if none was committed).
        final: Final evaluation of the global model (``EvalReport.to_dict()``).
        final_local_only: Final evaluation of each local-only model, by participant.
        final_pooled_oracle: Final evaluation of the pooled-data oracle, if trained.
        final_fedavg: Final evaluation of the FedAvg ablation, if trained.
        output_dir: Where files were written.
        wall_s: Wall time of this process (seconds).
        resumed_from: Model version (rounds committed before) this process resumed from; None
            for a run from the start.
        history: Every committed round's metrics line of the whole run (``metrics.jsonl``),
            those of earlier processes before a resume included; the best rounds are taken
            from it. Empty: ``metrics`` is the whole run.
        stopped: Why the run ended before ``federation.rounds`` (the central privacy budget
            was spent), or None.
        kept: Under ``federation.final_model: best_reported``, the committed version the run
            ends with (``version``, ``round``, ``model_hash``, ``last_version``, ``score``,
            ``why``; :mod:`lensemble.federation.keep_best`): ``model_hash`` and ``final`` are
            that version's. None under ``last``.
    """

    config_hash: str
    records: list[RoundRecord]
    metrics: list[RoundMetrics]
    model_hash: str
    final: dict[str, Any] | None
    final_local_only: dict[str, dict[str, Any]] = field(default_factory=dict)
    final_pooled_oracle: dict[str, Any] | None = None
    final_fedavg: dict[str, Any] | None = None
    output_dir: Path = Path()
    wall_s: float = 0.0
    resumed_from: int | None = None
    history: list[RoundMetrics] = field(default_factory=list)
    stopped: str | None = None
    kept: dict[str, Any] | None = None

    def run_metrics(self) -> list[RoundMetrics]:
        """The whole run's metrics lines: ``history``, else this process's ``metrics``."""
        return self.history or self.metrics


def mean_local_only_union(local_only: dict[str, dict[str, Any]] | None) -> float | None:
    """Mean over participants of each local-only model's k-step error on the union (or None)."""
    if not local_only:
        return None
    values = [float(r["union"]["k_step_error"]) for r in local_only.values()]
    return sum(values) / len(values)


def best_single_site(local_only: dict[str, dict[str, Any]] | None) -> tuple[str, float] | None:
    """The participant whose local-only model has the lowest union k-step error, and that error.

    Ties go to the first id in sorted order; None without local-only scores.
    """
    if not local_only:
        return None
    errors = {pid: float(r["union"]["k_step_error"]) for pid, r in sorted(local_only.items())}
    pid = min(errors, key=errors.__getitem__)
    return pid, errors[pid]


def best_round(metrics: list[RoundMetrics], model: str = "federated") -> tuple[int, float] | None:
    """The best evaluated round of ``model``: the lowest union k-step error.

    Args:
        metrics: The run's round metrics.
        model: ``federated``, ``pooled_oracle`` or ``fedavg`` (a :class:`RoundMetrics` field).

    Returns:
        ``(round, error)`` with the ledger's 0-based ``round``, the earliest round on ties; None
        if none was evaluated.
    """
    scored = [
        (m.round, float(getattr(m, model)["union"]["k_step_error"]))
        for m in metrics
        if getattr(m, model)
    ]
    if not scored:
        return None
    return min(scored, key=lambda item: (item[1], item[0]))


def _union(report: dict[str, Any] | None) -> float | None:
    return None if not report else float(report["union"]["k_step_error"])


def _central_privacy(records: list[RoundRecord]) -> dict[str, Any] | None:
    """The newest ``defences.central_privacy`` entry of the ledger's lines, or None."""
    for record in reversed(records):
        entry = record.defences.get("central_privacy")
        if isinstance(entry, dict):
            return dict(entry)
    return None


def summary(result: SimulationResult, report_png: Path | None) -> dict[str, Any]:
    """The run's one-object summary (what ``lensemble simulate --json`` prints).

    Args:
        result: The run's result.
        report_png: The report plot, if one was written.

    Returns:
        JSON-ready dict: hashes, the committed hash chain, round and attempt counts, the union
        k-step error and probe R^2 of the final model; the union error of each baseline (mean
        local-only, the best single site and its id, the pooled-data oracle, FedAvg; None when
        not trained); the best evaluated round of the whole run (the ledger's 0-based ``round``,
        rounds before a resume included) and its union error, for the federated model and the
        oracle; bytes moved (bytes), wall time (seconds) and where the files are; ``divergence``:
        what the divergence guard did (rollbacks, suspects, and a ``warning`` sentence when the
        run rolled back or its newest judged model is worse than its best,
        :func:`lensemble.federation.guard.summary`); ``final_model``: under
        ``federation.final_model: best_reported`` the version kept and why (``model_hash`` and
        the federated errors are then that version's), else None; ``central_privacy``: under
        ``federation.central_privacy`` the newest release's ledger entry (the user-level epsilon
        spent, delta, the releases, z, C and the noise's standard deviation on the mean), else
        None.
    """
    final = result.final or {}
    committed = [r for r in result.records if r.state == "closed"]
    history = result.run_metrics()
    best, peak = best_single_site(result.final_local_only), best_round(history)
    oracle_peak = best_round(history, "pooled_oracle")
    return {
        "config_hash": result.config_hash,
        "model_hash": result.model_hash,
        "hash_chain": committed_chain(result.records),
        "rounds_committed": len(committed),
        "resumed_from_version": result.resumed_from,
        "stopped": result.stopped,
        "final_model": result.kept,
        "central_privacy": _central_privacy(result.records),
        "aborted_attempts": sum(r.state == "aborted" for r in result.records),
        "federated_union_k_step_error": final.get("union", {}).get("k_step_error"),
        "federated_union_probe_r2": final.get("union", {}).get("probe_r2"),
        "local_only_mean_union_k_step_error": mean_local_only_union(result.final_local_only),
        "best_single_site": best[0] if best else None,
        "best_single_site_union_k_step_error": best[1] if best else None,
        "pooled_oracle_union_k_step_error": _union(result.final_pooled_oracle),
        "pooled_oracle_best_round": oracle_peak[0] if oracle_peak else None,
        "pooled_oracle_best_round_union_k_step_error": oracle_peak[1] if oracle_peak else None,
        "fedavg_union_k_step_error": _union(result.final_fedavg),
        "federated_best_round": peak[0] if peak else None,
        "federated_best_round_union_k_step_error": peak[1] if peak else None,
        "bytes_up": sum(r.bytes_up for r in result.records),
        "bytes_down": sum(r.bytes_down for r in result.records),
        "wall_s": round(result.wall_s, 3),
        "output_dir": str(result.output_dir),
        "report_png": str(report_png) if report_png else None,
        "divergence": divergence_summary(result.records),
    }
