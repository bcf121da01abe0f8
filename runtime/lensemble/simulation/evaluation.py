"""Held-out scores of a run on one machine: the global model and the local-only baseline.

The local-only baseline is each participant training alone for the same inner steps per
committed round (:class:`lensemble.model.inner_loop.LocalOnlyRun`); next to the global model's
scores it shows what federation buys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from lensemble.config import LensembleConfig
    from lensemble.data.trajectories import ParticipantData


class Evaluation:
    """Scores models on the union of every participant's held-out episodes, and per participant.

    Args:
        config: The run's config (``evaluation``, ``federation.inner_steps``).
        datasets: Participant id -> its data; read from each participant's cache (or collected)
            when omitted.
    """

    def __init__(
        self, config: LensembleConfig, datasets: Mapping[str, ParticipantData] | None = None
    ) -> None:
        from lensemble.data.trajectories import load_or_collect
        from lensemble.model.inner_loop import LocalOnlyRun

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
        from lensemble.eval.heldout import evaluate

        return {
            pid: evaluate(self.config, run.train_until(rounds), self.datasets).to_dict()
            for pid, run in self.baselines.items()
        }
