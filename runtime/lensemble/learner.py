"""The seam between the federation runtime and what a participant computes on its own data.

The coordinator and the round state machine never see data or models, only named float32
tensors. A participant holds a :class:`Learner`: it trains from the global parameters for ``H``
inner steps on data that never leaves the participant, and returns its local parameters. The
built-in implementation is :class:`lensemble.model.inner_loop.WorldModelLearner`; tests use small
deterministic learners.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

Params = dict[str, "torch.Tensor"]


@dataclass(frozen=True)
class LocalRound:
    """What one participant produced in one round.

    Attributes:
        params: Local parameters after the inner steps: name -> float32 tensor, same names and
            shapes as the global model.
        mean_loss: Mean training loss over the inner steps (unitless); NaN when the learner
            does not report it (under differential privacy it is an unprotected statistic).
        compute_seconds: Wall time spent in the inner steps (seconds).
        privacy_epsilon: The differential-privacy epsilon the participant has spent after this
            round, at its own delta (unitless); None without differential privacy.
    """

    params: Params
    mean_loss: float
    compute_seconds: float
    privacy_epsilon: float | None = None


@runtime_checkable
class Learner(Protocol):
    """A participant's local training, inside its trust domain.

    Inner optimizer state (AdamW moments, an EMA target if any) stays with the learner across
    rounds, as in DiLoCo (arXiv 2311.08105, Algorithm 1): only parameters are reset to the
    global model at the start of each round.

    The in-process simulation trains several learners at once on worker threads; a learner
    that must train on the main thread says so with a class attribute
    ``main_thread_only = True`` (a rank group, whose launcher installs signal handlers).
    """

    def train_round(
        self, global_params: Mapping[str, torch.Tensor], round_index: int, steps: int
    ) -> LocalRound:
        """Start from ``global_params`` and run ``steps`` inner steps.

        Deterministic given the global parameters, the round index, the learner's inner state
        and the config: batches are drawn from a generator seeded by
        ``derive(root_seed, f"batches:{participant_id}:round:{round_index}")``.

        Raises:
            PrivacyBudgetExhausted: The round would spend more than the participant's own
                differential-privacy budget; nothing was trained.
        """
        ...

    def heldout_loss(self, global_params: Mapping[str, torch.Tensor]) -> float | None:
        """The loss of ``global_params`` on the participant's own held-out data (unitless).

        What a participant reports about each model it receives (the coordinator's divergence
        guard takes the median of the reports). Deterministic, changes no inner state, and
        draws no batch: the same model gives the same bits on every run.

        Returns:
            The loss (lower is better; finite, >= 0), or None when the learner has no held-out
            data.
        """
        ...

    def inner_state(self) -> Params:
        """Inner optimizer state (and EMA target) as named tensors, for checkpoints.

        The tensors are copies: a snapshot may be written from them while training goes on.
        """
        ...

    def load_inner_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Restore what :meth:`inner_state` returned (on resume or rejoin).

        An empty mapping resets the learner to its initial inner state (no optimizer history).
        """
        ...
