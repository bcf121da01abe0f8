"""What the coordinator's defences remember across rounds, and the rollback they may commit.

:class:`DefenceHistory` holds each participant's suspicion score
(:mod:`lensemble.federation.suspicion`), whom the last commit set aside
(:mod:`lensemble.federation.set_aside`), the divergence guard (:mod:`lensemble.federation.guard`)
and where the best judged model is kept: its checkpoint, pinned against pruning, or a copy in
memory when the coordinator writes no checkpoints. Within an attempt it only computes (scores,
a verdict, the copy of a model about to become the best); a committing attempt's results become
the current ones (:meth:`DefenceHistory.keep`), so an aborted attempt changes nothing. A resume
replays both from the verified ledger (:meth:`DefenceHistory.replay`).
"""

from __future__ import annotations

import logging

from lensemble.config.schema import RobustnessConfig
from lensemble.errors import IntegrityError, unreplayable
from lensemble.federation.attempt import Attempt
from lensemble.federation.coordinator_store import CoordinatorStore, ModelState
from lensemble.federation.guard import DivergenceGuard, Judgement
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.payload import model_hash
from lensemble.federation.set_aside import recorded_set_aside
from lensemble.federation.suspicion import Suspicion
from lensemble.machinery.flat import flat_copy

_log = logging.getLogger("lensemble.federation.coordinator")


def _short(x: float | None) -> float | None:
    """A float for the ledger: 6 significant digits (None stays None)."""
    return None if x is None else float(f"{x:.6g}")


class DefenceHistory:
    """Suspicion scores, the divergence guard and the best judged model of one coordinator.

    Args:
        robustness: ``federation.robustness`` (``guard`` among it).
        store: The coordinator's checkpoints (None inside: the best model is kept in memory).
    """

    def __init__(self, robustness: RobustnessConfig, store: CoordinatorStore) -> None:
        self.store = store
        self.suspicion = Suspicion()
        # Whom the last committed round set aside (lensemble.federation.set_aside).
        self.set_aside: list[str] = []
        self.guard = DivergenceGuard(robustness.guard) if robustness.guard.enabled else None
        # Without checkpoints, the best judged model's copy (and the copy taken when an
        # attempt judges the current model best, until that attempt commits).
        self._best: ModelState | None = None
        self._pending: ModelState | None = None

    def replay(self, earlier: list[RoundRecord]) -> None:
        """Continue from the verified records of the attempts before a resume.

        Raises:
            IntegrityError: A record's guard verdict is not what its reports give.
        """
        committed = [r for r in earlier if r.state == "closed"]
        self.suspicion = Suspicion.replay(committed)
        self.set_aside = recorded_set_aside(committed[-1]) if committed else []
        if self.guard is None:
            return
        try:
            self.guard = DivergenceGuard.replay(self.guard.settings, committed)
        except ValueError as exc:
            raise unreplayable(exc) from None
        if self.guard.state.best is not None:
            self.store.pin(self.guard.state.best)

    def score(self, current: Attempt) -> None:
        """Record the contributors' cosines and their suspicion scores after this attempt.

        Reads the norms ``current.defences`` records (the screening's) and the collection's
        cosines; the scores go to ``current.scores`` and ``defences.suspicion``.
        """
        col = current.collection
        assert col is not None
        norms = current.defences.get("norms")
        assert isinstance(norms, dict)
        cosines = {pid: _short(col.cosines.get(pid)) for pid in sorted(norms)}
        current.defences["cosines"] = cosines
        current.scores = self.suspicion.updated(norms, cosines)
        current.defences["suspicion"] = current.scores

    def judge(self, current: Attempt, state: ModelState) -> Judgement | None:
        """The guard's verdict on ``state``'s model from the contributors' reports (None: off).

        Args:
            current: The attempt (its collection's contributors and reports; gets ``guard``
                and ``judgement``).
            state: The model the attempt trained from.
        """
        if self.guard is None:
            return None
        col = current.collection
        assert col is not None
        reports = {pid: col.reported[pid].get("heldout_loss") for pid in col.contributors}
        before = self.guard.state
        suspects = self.suspicion.suspects(current.scores or {})
        judgement = self.guard.judge(state.version, state.model_hash, reports, suspects)
        current.guard = judgement.to_record(self.guard.settings, before)
        current.judgement = judgement
        self._pending = None
        new_best = judgement.state.best == state.version and before.best != state.version
        if new_best and self.store.checkpoints is None:
            self._pending = ModelState(
                state.version,
                flat_copy(state.params),
                flat_copy(state.momentum),
                state.model_hash,
                state.parent_hash,
            )
        return judgement

    def roll_back(self, judgement: Judgement, state: ModelState) -> str:
        """Copy the best judged model and its momentum into ``state``; the new model's hash.

        Args:
            judgement: The rollback verdict (its ``why`` is logged).
            state: The current model (its tensors are overwritten in place).

        Returns:
            The hash of version ``state.version + 1`` with the best model's parameters.

        Raises:
            IntegrityError: The best model's checkpoint is gone or does not match its hash.
        """
        best = self._best_state(self.guard.state.best if self.guard else None)
        for name in sorted(state.params):
            state.params[name].copy_(best.params[name])
            state.momentum[name].copy_(best.momentum[name])
        _log.warning("round %d: %s", state.version, judgement.why)
        return model_hash(state.params, state.version + 1, state.model_hash)

    def _best_state(self, version: int | None) -> ModelState:
        """The best judged model's state: the copy in memory, or its (pinned) checkpoint."""
        if self._best is not None and self._best.version == version:
            return self._best
        ckpt = (
            self.store.checkpoints.load(version)
            if self.store.checkpoints is not None and version is not None
            else None
        )
        if ckpt is None or ckpt.version != version:
            raise IntegrityError(
                f"the checkpoint of model v{version}, the best judged one the divergence guard "
                "rolls back to, is missing;",
                remediation="run `lensemble verify` on the folder; restore it from a backup.",
            )
        return ModelState(version, ckpt.params, ckpt.momentum, ckpt.model_hash, ckpt.parent_hash)

    def keep(self, current: Attempt) -> None:
        """A committing attempt's scores and verdict become the current ones."""
        if current.scores is not None:
            self.suspicion.apply(current.scores)
        aside = current.defences.get("set_aside")
        self.set_aside = sorted(aside) if isinstance(aside, dict) else []
        judgement = current.judgement
        if self.guard is None or judgement is None:
            return
        self.guard.apply(judgement)
        if self._pending is not None:
            self._best, self._pending = self._pending, None
        if judgement.state.best is not None:
            self.store.pin(judgement.state.best)
