"""The coordinator's side of ``federation.final_model``: which committed version a run ends with.

``last`` (the default) ends a run with its last committed version and records nothing. With
``best_reported`` each attempt scores the version it trained from by its kept contributors'
median held-out report and records it in ``defences.best_reported``
(:mod:`lensemble.federation.keep_best`); a commit makes that scoring current, and the best
version's model is kept: its checkpoint pinned against pruning, or a copy in memory when the
coordinator writes no checkpoints. At the end of the run :meth:`FinalModel.choose` names the
version kept and hands its parameters over. A resume replays the scoring from the verified
ledger (:meth:`FinalModel.replay`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lensemble.config.schema import FederationConfig
from lensemble.errors import IntegrityError, unreplayable
from lensemble.federation.attempt import Attempt
from lensemble.federation.checkpoint import CheckpointStore, CoordinatorCheckpoint
from lensemble.federation.coordinator_store import CoordinatorStore, ModelState
from lensemble.federation.keep_best import (
    ENTRY,
    BestReported,
    FinalChoice,
    Scoring,
    final_choice,
    kept_reports,
)
from lensemble.federation.ledger import RoundRecord
from lensemble.machinery.flat import flat_copy

Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class KeptModel:
    """The model a run ends with.

    Attributes:
        choice: Which version, and why.
        params: Its parameters, name -> float32 tensor.
    """

    choice: FinalChoice
    params: Params


class FinalModel:
    """Scores each attempt's model and keeps the best one (``best_reported``; else inert).

    Args:
        federation: ``federation`` (``final_model`` and ``quorum``).
        store: The coordinator's checkpoints (without a folder the best model is kept in
            memory).
    """

    def __init__(self, federation: FederationConfig, store: CoordinatorStore) -> None:
        self.enabled = federation.final_model == "best_reported"
        self.tracker = BestReported(federation.quorum)
        self.store = store
        self._scoring: Scoring | None = None
        # Without checkpoints: the best version's copy, and the one an attempt may make best.
        self._best: ModelState | None = None
        self._pending: ModelState | None = None

    def replay(self, committed: list[RoundRecord]) -> None:
        """Continue from the verified committed records before a resume.

        Raises:
            IntegrityError: A record's ``best_reported`` entry is not what its reports give.
        """
        if not self.enabled:
            return
        try:
            self.tracker = BestReported.replay(self.tracker.quorum, committed)
        except ValueError as exc:
            raise unreplayable(exc) from None
        if self.tracker.state.version is not None:
            self.store.pin_kept(self.tracker.state.version)

    def score(self, current: Attempt, state: ModelState) -> None:
        """Score ``state``'s model from the attempt's kept reports into ``current.defences``."""
        col = current.collection
        if not self.enabled or col is None:
            return
        aside = current.defences.get("set_aside")
        reports = kept_reports(
            col.reported, col.contributors, aside if isinstance(aside, dict) else ()
        )
        scoring = self.tracker.score(state.version, state.model_hash, reports)
        current.defences[ENTRY] = scoring.to_record()
        self._scoring = scoring
        self._pending = None
        became_best = scoring.state.version == state.version != self.tracker.state.version
        if became_best and self.store.checkpoints is None:
            self._pending = ModelState(
                state.version,
                flat_copy(state.params),
                flat_copy(state.momentum),
                state.model_hash,
                state.parent_hash,
            )

    def keep(self) -> None:
        """A committing attempt's scoring becomes the current one."""
        scoring, self._scoring = self._scoring, None
        if not self.enabled or scoring is None:
            return
        self.tracker.apply(scoring)
        if self._pending is not None:
            self._best, self._pending = self._pending, None
        if scoring.state.version is not None:
            self.store.pin_kept(scoring.state.version)

    def choose(self, state: ModelState) -> KeptModel | None:
        """The model the run ends with, after its last commit (None under ``last``).

        Args:
            state: The last committed model.

        Raises:
            IntegrityError: The kept version's checkpoint is gone or does not match its hash.
        """
        if not self.enabled:
            return None
        choice = final_choice(self.tracker.state, state.version, state.model_hash)
        if choice.version == state.version:
            return KeptModel(choice, state.params)
        if self._best is not None and self._best.version == choice.version:
            return KeptModel(choice, self._best.params)
        return _from_checkpoint(self.store.checkpoints, choice)


def kept_in_record(
    federation: FederationConfig,
    committed: list[RoundRecord],
    checkpoints: CheckpointStore,
    last: CoordinatorCheckpoint,
) -> KeptModel | None:
    """The model a finished run ends with, read from its folder (None under ``last``).

    For a run whose coordinator was another process (``simulate`` over the network).

    Args:
        federation: ``federation`` (``final_model`` and ``quorum``).
        committed: The run's committed ledger records, in order.
        checkpoints: The run's coordinator checkpoints.
        last: The last committed version's checkpoint.

    Raises:
        IntegrityError: A record's entry is not what its reports give, or the kept version's
            checkpoint is gone or is another model.
    """
    if federation.final_model != "best_reported":
        return None
    try:
        tracker = BestReported.replay(federation.quorum, committed)
    except ValueError as exc:
        raise IntegrityError(
            f"{exc};", remediation="run `lensemble verify` on the folder."
        ) from None
    choice = final_choice(tracker.state, last.version, last.model_hash)
    if choice.version == last.version:
        return KeptModel(choice, dict(last.params))
    return _from_checkpoint(checkpoints, choice)


def _from_checkpoint(checkpoints: CheckpointStore | None, choice: FinalChoice) -> KeptModel:
    """The kept version's parameters from its (pinned) checkpoint.

    Raises:
        IntegrityError: The checkpoint is gone or holds another model.
    """
    ckpt = checkpoints.load(choice.version) if checkpoints is not None else None
    if ckpt is None or ckpt.version != choice.version or ckpt.model_hash != choice.model_hash:
        raise IntegrityError(
            f"the checkpoint of model v{choice.version}, the best reported version the run "
            "ends with (federation.final_model), is missing or is another model;",
            remediation="run `lensemble verify` on the folder; restore it from a backup.",
        )
    return KeptModel(choice, dict(ckpt.params))
