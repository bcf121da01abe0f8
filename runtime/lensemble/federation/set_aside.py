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
(weight 0.5 per round) and it is back in the mean once the score is below
:data:`~lensemble.federation.suspicion.SUSPECT_SCORE`. An honest participant is never set aside
in our measurements: its score stays below the threshold (docs/security.md#suspicion-from-history).
Under masking no single update is seen, so nobody is scored and nobody is set aside.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from lensemble.federation.suspicion import SUSPECT_SCORE


def set_aside(scores: Mapping[str, float], kept: Iterable[str]) -> dict[str, float]:
    """The kept updates to leave out of the round's mean, with the score that names each.

    Args:
        scores: Participant id -> suspicion score after the last committed round (unitless,
            ``defences.suspicion`` of the last committed ledger line; empty before any).
        kept: The ids of the round's updates the norm bound keeps.

    Returns:
        Participant id -> its score (>= ``SUSPECT_SCORE``), sorted by id: every kept
        participant named a suspect, when they are fewer than half of ``kept``; else empty.
    """
    order = sorted(kept)
    named = [pid for pid in order if scores.get(pid, 0.0) >= SUSPECT_SCORE]
    if 2 * len(named) >= len(order):
        return {}
    return {pid: scores[pid] for pid in named}
