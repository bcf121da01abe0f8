"""Communication overlapped with training: the model a round trains from (``federation.overlap``).

Under ``mode: blocking`` (DiLoCo) round t trains from ``G_t``, the model round t - 1 committed,
so a participant waits for the upload, the aggregation and the download between two rounds.
Under ``mode: one_round`` round t trains from the model the previous round announced,
``G_{t-1}``, plus ``local_weight`` of the participant's own progress in round t - 1:

    base_m(t) = G_{t-1} - local_weight * delta_m(t-1)

(Streaming DiLoCo's merge of local and global parameters, Douillard et al., 2025, with a full
round of overlap; ``local_weight`` 0 is the one-step-delayed outer update of Kale, Douillard &
Donchev, 2025). Every input is already with the participant when it sends round t - 1's update,
so it can start round t's inner steps at once. The coordinator applies the round's mean
pseudo-gradient to ``G_t`` exactly as before.

The coordinator names the base in the round's announcement (:func:`round_base_hash`; empty when
the round trains from its own model) and admits only updates computed from it. Each participant
keeps the models of the last two announcements and its own last pseudo-gradients
(:class:`OverlapState`); the base is a function of those alone, so every substrate computes it
bit for bit alike. A participant that lacks the base (it missed round t - 1, or restarted) sits
the round out as ``no_base_model`` and trains again from the next.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from lensemble.config import LensembleConfig
from lensemble.errors import OverlapBaseMissing
from lensemble.federation.diloco import Params
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.messages import RoundOpening


def round_base_hash(
    config: LensembleConfig, history: Sequence[RoundRecord], model_hash: str, attempt: int
) -> str:
    """The hash of the model the next attempt trains from, or "" for ``model_hash`` itself.

    Under ``one_round``: the parent of the last commit, when that commit made ``model_hash``
    by an outer step. These train from ``model_hash``: the first round of a coordinator
    process (a resumed one included: its participants may hold no older model), a retried
    attempt (whoever lacked the base in the first one holds ``model_hash``, announced with
    it), and the round after a divergence-guard rollback (whose parent is the model it
    rejected).

    Args:
        config: The run's config.
        history: The attempts this coordinator process ran, oldest first (aborted included).
        model_hash: The coordinator's current model.
        attempt: The attempt about to open (0 for a round's first).
    """
    if config.federation.overlap.mode != "one_round" or attempt > 0:
        return ""
    last = next((r for r in reversed(history) if r.model_hash != r.parent_hash), None)
    if last is None or last.model_hash != model_hash or last.guard.get("action") == "rollback":
        return ""
    return last.parent_hash


class OverlapState:
    """What a participant keeps to compute an overlapped base (see the module).

    Holds up to two announced models (``hash -> float32 tensors``, copies) and its own
    pseudo-gradients of the last two rounds it trained (``round -> float32 tensors``): about
    four models of memory under ``one_round``, none under ``blocking``.

    Args:
        config: The run's config (``federation.overlap``).
    """

    def __init__(self, config: LensembleConfig) -> None:
        overlap = config.federation.overlap
        self.enabled = overlap.mode == "one_round"
        self.local_weight = overlap.local_weight
        self._models: dict[str, Params] = {}
        self._own: dict[int, tuple[int, Params]] = {}  # round -> (attempt, pseudo-gradient)

    def hold(self, opening: RoundOpening, announced: Mapping[str, torch.Tensor]) -> None:
        """Keep ``opening``'s announced model (verified), and its base; let older models go."""
        if not self.enabled:
            return
        if opening.model_hash not in self._models:
            self._models[opening.model_hash] = {k: v.clone() for k, v in announced.items()}
        for stale in [h for h in self._models if h not in (opening.model_hash, opening.base_hash)]:
            del self._models[stale]

    def base(
        self, opening: RoundOpening, announced: Mapping[str, torch.Tensor]
    ) -> Mapping[str, torch.Tensor]:
        """The parameters ``opening``'s attempt trains from.

        Args:
            opening: The attempt; ``base_hash`` names the base (empty: ``announced``).
            announced: The attempt's announced model, verified against ``model_hash``.

        Raises:
            OverlapBaseMissing: The base is a model this participant does not hold.
        """
        if not opening.base_hash or opening.base_hash == opening.model_hash:
            return announced
        held = self._models.get(opening.base_hash)
        if held is None:
            raise OverlapBaseMissing(
                f"round {opening.round_index} trains from model {opening.base_hash[:19]}..., "
                "which this participant did not receive (it missed the previous round or "
                "restarted);",
                remediation="it sits this round out and trains again from the next one.",
            )
        own = self._own.get(opening.round_index - 1)
        if own is None or self.local_weight == 0.0:
            return held
        weight = self.local_weight
        return {name: torch.sub(held[name], own[1][name], alpha=weight) for name in sorted(held)}

    def keep_own(self, opening: RoundOpening, delta: Mapping[str, torch.Tensor]) -> None:
        """Keep this participant's honest pseudo-gradient of ``opening``'s attempt."""
        if not self.enabled:
            return
        self._own[opening.round_index] = (
            opening.attempt,
            {k: v.detach().clone() for k, v in delta.items()},
        )
        for stale_round in [r for r in self._own if r < opening.round_index - 1]:
            del self._own[stale_round]

    def forget(self, round_index: int, attempt: int) -> None:
        """Drop the pseudo-gradient of ``(round_index, attempt)``: its update was not taken."""
        kept = self._own.get(round_index)
        if kept is not None and kept[0] == attempt:
            del self._own[round_index]
