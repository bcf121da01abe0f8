"""Named suspects are set aside: their updates get weight 0 in the round's mean.

Clipping bounds what one update can do in one round (:mod:`lensemble.federation.robustness`);
suspicion names, from its history, a participant whose updates have again and again been far
larger than the round's median or pointed against the outer momentum
(:mod:`lensemble.federation.suspicion`). A named participant that is only clipped still pulls
with ``1 / n`` of a median update every round, in a direction of its choosing; setting it aside
removes that pull. The decision uses the scores **before** the round (those of the last
committed ledger line), never the round's own update, so it is known before anything is
aggregated, a resume replays it from the ledger and ``lensemble verify`` checks it line by line.

Only a minority may be set aside: when the named participants are half or more of the round's
kept updates, the scores themselves are the majority's (the median they are judged against is
theirs), so nobody is set aside and the round is the clipped mean of everyone. A participant set
aside is still screened and scored, so its score decays as soon as it sends honest updates again
(weight 0.5 per round). It stays aside until the score falls below :data:`RELEASE_SCORE`, half
the threshold (hysteresis, as the divergence guard's streak): an attacker whose score hovers
around the threshold would otherwise be in the mean every other round. Which participants the
last committed round set aside is in its ledger line, so this too replays. An honest participant
is never set aside in our measurements: its score stays below the threshold
(docs/security.md#suspicion-from-history).
Under masking no single update is seen, so nobody is scored and nobody is set aside.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from lensemble.federation.ledger import RoundRecord
from lensemble.federation.suspicion import SUSPECT_SCORE

#: Score under which a participant set aside in the last committed round is back in the mean.
RELEASE_SCORE = SUSPECT_SCORE / 2


def set_aside(
    scores: Mapping[str, float], kept: Iterable[str], before: Iterable[str] = ()
) -> dict[str, float]:
    """The kept updates to leave out of the round's mean, with the score that names each.

    Args:
        scores: Participant id -> suspicion score after the last committed round (unitless,
            ``defences.suspicion`` of the last committed ledger line; empty before any).
        kept: The ids of the round's updates the norm bound keeps.
        before: The participants the last committed round set aside (its ``set_aside``).

    Returns:
        Participant id -> its score, sorted by id: every kept participant scoring at least
        ``SUSPECT_SCORE``, or at least ``RELEASE_SCORE`` when in ``before``, as long as they
        are fewer than half of ``kept``; else empty.
    """
    order = sorted(kept)
    held = set(before)
    named = [
        pid
        for pid in order
        if scores.get(pid, 0.0) >= (RELEASE_SCORE if pid in held else SUSPECT_SCORE)
    ]
    if 2 * len(named) >= len(order):
        return {}
    return {pid: scores[pid] for pid in named}


def recorded_set_aside(record: RoundRecord) -> list[str]:
    """Whom a committed ledger line set aside (``defences.set_aside``), sorted; [] when none."""
    aside = record.defences.get("set_aside")
    return sorted(map(str, aside)) if isinstance(aside, dict) else []
