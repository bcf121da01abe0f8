"""Held-out scores of a run on one machine: the global model and its baselines.

The baselines (:mod:`lensemble.simulation.baselines`) are each participant training alone for
the same inner steps per committed round, the pooled-data oracle (one model on everyone's
training data with the same total inner steps) and the FedAvg ablation (outer learning rate 1,
no momentum); next to the global model's scores they show what federation buys, and what it
leaves on the table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any

from lensemble.machinery.cpus import cores_given

if TYPE_CHECKING:
    import torch

    from lensemble.config import LensembleConfig
    from lensemble.data.trajectories import ParticipantData
    from lensemble.simulation.summary import RoundMetrics


class Evaluation:
    """Scores models on the union of every participant's held-out episodes, and per participant.

    Args:
        config: The run's config (``evaluation``, ``federation.inner_steps``).
        datasets: Participant id -> its data; read from each participant's cache (or collected)
            when omitted.
        workers: Baselines trained at once, on threads (default: one per core this process is
            given). Each baseline trains single-threaded on its own generators, so any count
            gives the same scores.
    """

    def __init__(
        self,
        config: LensembleConfig,
        datasets: Mapping[str, ParticipantData] | None = None,
        *,
        workers: int | None = None,
    ) -> None:
        from lensemble.data.trajectories import load_or_collect
        from lensemble.model.inner_loop import LocalOnlyRun
        from lensemble.simulation.baselines import FEDAVG, DilocoRun, PooledRun

        self.config = config
        self.datasets = dict(
            datasets or {pid: load_or_collect(config, pid) for pid in config.participant_ids}
        )
        steps = config.federation.inner_steps
        self.baselines = (
            {pid: LocalOnlyRun(config, pid, data, steps) for pid, data in self.datasets.items()}
            if config.evaluation.local_only_baseline
            else {}
        )
        ev = config.evaluation
        self.pooled = PooledRun(config, self.datasets) if ev.pooled_oracle else None
        self.fedavg = (
            DilocoRun(config, self.datasets, FEDAVG, robust=False) if ev.fedavg_ablation else None
        )
        self.workers = cores_given() if workers is None else workers

    def federated(self, params: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """``EvalReport.to_dict()`` of the global model ``params``."""
        from lensemble.eval.heldout import evaluate

        result: dict[str, Any] = evaluate(self.config, params, self.datasets).to_dict()
        return result

    def local_only(self, rounds: int) -> dict[str, dict[str, Any]]:
        """``EvalReport.to_dict()`` of each participant's local-only model after ``rounds``.

        Empty when ``evaluation.local_only_baseline`` is off. Trains each baseline up to
        ``rounds`` first (rounds already trained are not repeated).
        """
        return {pid: self.local_only_of(pid, rounds) for pid in self.baselines}

    def pooled_oracle(self, rounds: int) -> dict[str, Any] | None:
        """``EvalReport.to_dict()`` of the pooled-data oracle after ``rounds`` (trained first).

        None when ``evaluation.pooled_oracle`` is off.
        """
        from lensemble.eval.heldout import evaluate

        if self.pooled is None:
            return None
        report: dict[str, Any] = evaluate(
            self.config, self.pooled.train_until(rounds), self.datasets
        ).to_dict()
        return report

    def fedavg_ablation(self, rounds: int) -> dict[str, Any] | None:
        """``EvalReport.to_dict()`` of the FedAvg federation after ``rounds`` (trained first).

        None when ``evaluation.fedavg_ablation`` is off.
        """
        from lensemble.eval.heldout import evaluate

        if self.fedavg is None:
            return None
        report: dict[str, Any] = evaluate(
            self.config, self.fedavg.train_until(rounds), self.datasets
        ).to_dict()
        return report

    def score(self, line: RoundMetrics, params: Mapping[str, torch.Tensor], rounds: int) -> None:
        """Fill ``line`` with the global model's scores and every enabled baseline's."""
        line.federated = self.federated(params)
        self.score_baselines(line, rounds)

    def score_baselines(self, line: RoundMetrics, rounds: int) -> None:
        """Fill ``line`` with every enabled baseline's scores after ``rounds`` rounds.

        The baselines depend only on the config, the seed and the participants' data, never on
        the federated run, so a line rebuilt on resume gets exactly the values the lost line had.
        They train side by side (``workers``); each one's scores are its own either way.
        """
        jobs: list[Callable[[], Any]] = [
            partial(self.local_only_of, pid, rounds) for pid in self.baselines
        ]
        jobs += [partial(self.pooled_oracle, rounds), partial(self.fedavg_ablation, rounds)]
        if self.workers > 1 and len(jobs) > 1:
            with ThreadPoolExecutor(min(self.workers, len(jobs))) as pool:
                results = [future.result() for future in [pool.submit(job) for job in jobs]]
        else:
            results = [job() for job in jobs]
        local = dict(zip(self.baselines, results[: len(self.baselines)], strict=True))
        line.local_only = local or None
        line.pooled_oracle, line.fedavg = results[len(self.baselines) :]

    def local_only_of(self, participant: str, rounds: int) -> dict[str, Any]:
        """``EvalReport.to_dict()`` of ``participant``'s local-only model after ``rounds``."""
        from lensemble.eval.heldout import evaluate

        result: dict[str, Any] = evaluate(
            self.config, self.baselines[participant].train_until(rounds), self.datasets
        ).to_dict()
        return result
