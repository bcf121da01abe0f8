"""How suspicious each participant's updates have been, from its own history across rounds.

The aggregation rule is per round (every update clipped to the round's median norm, then the
mean: :mod:`lensemble.federation.robustness`); what a single round cannot see, a participant's
history can: an update that is again and again far larger than the round's median, or that
points against the outer momentum (the direction the federation has been moving in), round
after round. Each round the coordinator records, per contributor, its update's L2 norm (the
ledger's ``defences.norms``) and its cosine with the outer momentum before the step
(``defences.cosines``; none in round 0, when the momentum is zero). From them, with
``pull_i = (norm_i / median norm) * cosine_i`` the update's component along the momentum in
units of the round's median norm:

    evidence_i = min(MAX_EVIDENCE, max(0, ln(norm_i / median norm)) + max(0, -cosine_i)
                 + PULL_WEIGHT * max(0, pull_i - median pull - PULL_SLACK))
    score_i    = (1 - DECAY) * score_i + DECAY * evidence_i      (rounds it contributed to)

so an honest participant, whose norm stays within about 0.5-1.5 x the median and whose cosine
with the momentum is mostly positive, keeps a score near 0.1, while a sign-flipped or scaled
update scores its log norm ratio plus its negative cosine within two rounds (a sleeper within
two rounds of waking). The third term is for the attacks that push *with* the momentum: min-max
and min-sum estimate the honest mean from the last aggregate and send it plus a perturbation,
larger than the median, so their pull along the momentum is 0.5 to 2 median norms above the
round's median pull, round after round, where an honest update's stayed within 0.34 of it in
every clean run measured, 0.37 under attack (docs/security.md#the-pull-along-the-momentum). The
round's median pull, not a fixed cosine, is the reference: in the first rounds every honest
update points along the young momentum. One round's evidence is capped at
:data:`MAX_EVIDENCE`: the pull grows linearly with the norm, so one absurd update (a poison of
1e4s, or a bug) scored 7e4-1.6e5 and kept its sender set aside for the rest of a run; capped,
a participant that sent one is set aside for a few rounds (5-9 measured, docs/security.md) and
then weighed again, while one that keeps attacking keeps its score above the threshold. A
participant is a **suspect** once its score reaches :data:`SUSPECT_SCORE`, above what honest
participants reached in our measurements (docs/security.md#suspicion-from-history). The
scores are plain JSON in each committed ledger line (``defences.suspicion``), computed from the
rounded values the line itself records, so a resume replays them (:meth:`Suspicion.replay`)
and ``lensemble verify`` checks them.

A suspect's update is left out of the next rounds' mean (:mod:`lensemble.federation.set_aside`).
ALIE and the omniscient min-max and min-sum are built to look like honest updates: they mostly
stay unnamed, and their damage is bounded by the clipping instead (docs/security.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from lensemble.federation.ledger import RoundRecord

#: Weight of the newest round in a participant's score (an exponential moving average).
DECAY = 0.5
#: How far above the round's median pull along the momentum an update's pull may be before it
#: counts as evidence (units of the round's median norm).
PULL_SLACK = 0.5
#: Evidence per median norm of pull beyond :data:`PULL_SLACK`.
PULL_WEIGHT = 2.0
#: Score from which a participant is named a suspect.
SUSPECT_SCORE = 1.0
#: The most evidence one round adds: that of an update about 3,000 x the median norm
#: (ln 3000 = 8.0). With :data:`DECAY` 0.5 one such round gives a score of at most 4, which
#: halves towards the participant's own honest evidence in the rounds after it.
MAX_EVIDENCE = 8.0
#: The excess of a norm the ledger could not record (not finite): that of 1e30 x the median.
_UNBOUNDED_EXCESS = math.log(1e30)
_TINY = 1e-300


def _short(x: float) -> float:
    """6 significant digits (what the ledger keeps)."""
    return float(f"{x:.6g}")


def pull(norm: float | None, median: float, cosine: float | None) -> float:
    """An update's component along the outer momentum, in units of the round's median norm.

    Args:
        norm: The update's L2 norm (None: not finite).
        median: The round's median norm.
        cosine: Its cosine with the outer momentum, or None when there was no momentum.

    Returns:
        ``norm / median * cosine``; 0 when any of them is missing or the median is 0.
    """
    if median <= 0 or norm is None or cosine is None:
        return 0.0
    return norm / median * cosine


def evidence(
    norm: float | None,
    median: float,
    cosine: float | None,
    median_pull: float | None = None,
    cap: float | None = MAX_EVIDENCE,
) -> float:
    """One round's evidence against an update: excess log norm, negative cosine, excess pull.

    Args:
        norm: The update's L2 norm (None: not finite, counts as the largest excess).
        median: The round's median norm (0: no excess can be judged).
        cosine: Its cosine with the outer momentum, or None when there was no momentum.
        median_pull: The round's median :func:`pull` (None: no pull term).
        cap: The most one round may give (None: uncapped, as ledgers written before the
            cap, on 2026-12-05, were scored).
    """
    if median <= 0:
        excess = 0.0
    elif norm is None:
        excess = _UNBOUNDED_EXCESS
    else:
        excess = math.log(max(norm, _TINY) / median)
    seen = max(0.0, excess) + max(0.0, -(cosine or 0.0))
    if median_pull is not None:
        seen += PULL_WEIGHT * max(0.0, pull(norm, median, cosine) - median_pull - PULL_SLACK)
    return seen if cap is None else min(cap, seen)


class Suspicion:
    """Every participant's score so far (see the module docstring).

    Attributes:
        scores: Participant id -> score (unitless, >= 0), for those that contributed.
    """

    def __init__(self, *, pull_evidence: bool = True, capped: bool = True) -> None:
        """A history with no scores yet.

        Args:
            pull_evidence: Count the pull along the momentum (the third term). Off only to
                verify ledgers written before that term existed (before 2026-12-05), whose
                scores were computed without it.
            capped: Cap one round's evidence at :data:`MAX_EVIDENCE`. Off only to verify
                ledgers written before the cap, whose scores were computed without it.
        """
        self.scores: dict[str, float] = {}
        self.pull_evidence = pull_evidence
        self.cap = MAX_EVIDENCE if capped else None

    def updated(
        self, norms: Mapping[str, float | None], cosines: Mapping[str, float | None]
    ) -> dict[str, float]:
        """The scores after a round with these norms and cosines (not applied).

        Args:
            norms: Contributor id -> its update's norm as the ledger records it.
            cosines: Contributor id -> its cosine with the momentum as recorded (or None).

        Returns:
            Participant id -> score, every participant scored so far, sorted by id.
        """
        finite = [n for n in norms.values() if n is not None]
        median = statistics.median(sorted(finite)) if finite else 0.0
        pulls = sorted(pull(norms[pid], median, cosines.get(pid)) for pid in sorted(norms))
        median_pull = statistics.median(pulls) if pulls and self.pull_evidence else None
        scores = dict(self.scores)
        for pid in sorted(norms):
            seen = evidence(norms[pid], median, cosines.get(pid), median_pull, self.cap)
            before = scores.get(pid)
            scores[pid] = _short(seen if before is None else (1 - DECAY) * before + DECAY * seen)
        return dict(sorted(scores.items()))

    def apply(self, scores: Mapping[str, float]) -> None:
        """Make ``scores`` (from :meth:`updated`) the current ones."""
        self.scores = dict(scores)

    def suspects(self, scores: Mapping[str, float] | None = None) -> list[str]:
        """Participants whose score reaches :data:`SUSPECT_SCORE`, most suspicious first."""
        scores = self.scores if scores is None else scores
        named = [pid for pid, s in scores.items() if s >= SUSPECT_SCORE]
        return sorted(named, key=lambda pid: (-scores[pid], pid))

    @classmethod
    def replay(cls, records: Iterable[RoundRecord]) -> Suspicion:
        """The scores after the committed ``records`` (a resume continues from them)."""
        out = cls()
        for record in records:
            recorded = record_scores(record)
            if record.state == "closed" and recorded is not None:
                out.apply(recorded)
        return out


def record_scores(record: RoundRecord) -> dict[str, float] | None:
    """The scores a ledger record carries (``defences.suspicion``), or None (older lines)."""
    scores: Any = record.defences.get("suspicion")
    if not isinstance(scores, dict):
        return None
    return {str(k): float(v) for k, v in scores.items() if isinstance(v, (int, float))}
