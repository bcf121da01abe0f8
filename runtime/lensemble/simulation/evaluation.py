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
from lensemble.simulation.baselines import LOCAL_ONLY

if TYPE_CHECKING:
    import torch

    from lensemble.config import LensembleConfig
    from lensemble.data.trajectories import ParticipantData
    from lensemble.simulation.summary import RoundMetrics
    from lensemble.simulation.workers import SimulationWorkers


class Evaluation:
    """Scores models on the union of every participant's held-out episodes, and per participant.

    Args:
        config: The run's config (``evaluation``, ``federation.inner_steps``).
        datasets: Participant id -> its data; read from each participant's cache (or collected)
            when omitted.
        workers: Baselines trained at once, on threads (default: one per core this process is
            given). Each baseline trains single-threaded on its own generators, so any count
            gives the same scores.
        processes: Train and score the baselines in these worker processes instead of here
            (:class:`~lensemble.simulation.workers.SimulationWorkers`); the same scores.

    Attributes:
        names: The enabled baselines' names (``local_only:<participant id>`` per participant,
            ``pooled``, ``fedavg``), in the order the metrics list them.
    """

    def __init__(
        self,
        config: LensembleConfig,
        datasets: Mapping[str, ParticipantData] | None = None,
        *,
        workers: int | None = None,
        processes: SimulationWorkers | None = None,
    ) -> None:
        from lensemble.data.trajectories import load_or_collect

        self.config = config
        self.datasets = dict(
            datasets or {pid: load_or_collect(config, pid) for pid in config.participant_ids}
        )
        ev = config.evaluation
        self.local_ids = list(self.datasets) if ev.local_only_baseline else []
        self.names = [f"{LOCAL_ONLY}{pid}" for pid in self.local_ids]
        self.names += [
            name
            for name, on in (("pooled", ev.pooled_oracle), ("fedavg", ev.fedavg_ablation))
            if on
        ]
        self.workers = cores_given() if workers is None else workers
        self._processes = processes
        #: Baseline name -> its run, when trained here (built on first use).
        self._runs: dict[str, Any] = {}
        if processes is not None:
            processes.deal_baselines(self.names)

    def federated(self, params: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """``EvalReport.to_dict()`` of the global model ``params``."""
        from lensemble.eval.heldout import evaluate

        result: dict[str, Any] = evaluate(self.config, params, self.datasets).to_dict()
        return result

    def baseline(self, name: str, rounds: int) -> dict[str, Any] | None:
        """``EvalReport.to_dict()`` of baseline ``name`` after ``rounds`` (trained first).

        Rounds already trained are not repeated. None when that baseline is off in
        ``evaluation``.
        """
        if name not in self.names:
            return None
        if self._processes is not None:
            return self._processes.baseline(name, rounds)
        from lensemble.eval.heldout import evaluate
        from lensemble.simulation.baselines import baseline_run

        if name not in self._runs:
            self._runs[name] = baseline_run(self.config, self.datasets, name)
        params = self._runs[name].train_until(rounds)
        report: dict[str, Any] = evaluate(self.config, params, self.datasets).to_dict()
        return report

    def local_only(self, rounds: int) -> dict[str, dict[str, Any]]:
        """``EvalReport.to_dict()`` of each participant's local-only model after ``rounds``.

        Empty when ``evaluation.local_only_baseline`` is off.
        """
        return {pid: self.local_only_of(pid, rounds) for pid in self.local_ids}

    def local_only_of(self, participant: str, rounds: int) -> dict[str, Any]:
        """``EvalReport.to_dict()`` of ``participant``'s local-only model after ``rounds``.

        Raises:
            KeyError: The local-only baselines are off, or no participant has that id.
        """
        report = self.baseline(f"{LOCAL_ONLY}{participant}", rounds)
        if report is None:
            raise KeyError(participant)
        return report

    def pooled_oracle(self, rounds: int) -> dict[str, Any] | None:
        """The pooled-data oracle's scores after ``rounds``; None when it is off."""
        return self.baseline("pooled", rounds)

    def fedavg_ablation(self, rounds: int) -> dict[str, Any] | None:
        """The FedAvg federation's scores after ``rounds``; None when it is off."""
        return self.baseline("fedavg", rounds)

    def score(self, line: RoundMetrics, params: Mapping[str, torch.Tensor], rounds: int) -> None:
        """Fill ``line`` with the global model's scores and every enabled baseline's."""
        line.federated = self.federated(params)
        self.score_baselines(line, rounds)

    def score_baselines(self, line: RoundMetrics, rounds: int) -> None:
        """Fill ``line`` with every enabled baseline's scores after ``rounds`` rounds.

        The baselines depend only on the config, the seed and the participants' data, never on
        the federated run, so a line rebuilt on resume gets exactly the values the lost line had.
        They train side by side (``workers`` threads, or every worker process); each one's
        scores are its own either way.
        """
        jobs: list[Callable[[], Any]] = [
            partial(self.baseline, name, rounds) for name in self.names
        ]
        # In worker processes a thread only waits on a pipe: one per baseline.
        threads = len(jobs) if self._processes is not None else min(self.workers, len(jobs))
        if threads > 1:
            with ThreadPoolExecutor(threads) as pool:
                results = [future.result() for future in [pool.submit(job) for job in jobs]]
        else:
            results = [job() for job in jobs]
        scores = dict(zip(self.names, results, strict=True))
        local = {pid: scores[f"{LOCAL_ONLY}{pid}"] for pid in self.local_ids}
        line.local_only = local or None
        line.pooled_oracle, line.fedavg = scores.get("pooled"), scores.get("fedavg")
