"""Keep the best committed version: the participants' median held-out report picks the final model.

With ``federation.final_model: best_reported`` a run ends with the committed version the
participants scored best, not merely the last one. With its update for round ``t`` each
participant reports ``heldout_loss``, the loss of the model it received (version ``t``) on its
own held-out data (:mod:`lensemble.federation.guard` reads the same reports). Version ``t``'s
**score** is the median of the reports of the round's kept contributors (those whose update the
norm bound kept and the suspicion scores did not set aside), once at least ``quorum`` of them
reported a finite, non-negative loss; with fewer the version is unscored. The median of at least
``quorum`` (a strict majority by default) reports moves only as far as the honest reports
around it: one participant reporting 0 or 1e6 cannot make a version best or rob it of being
best.

The **best** version is the one with the lowest score so far (the earliest on ties). Each
committed ledger line records, in ``defences.best_reported``, the score of the version its
round scored and the best version after it (its index, model hash and score), so a resume
replays it (:meth:`BestReported.replay`) and ``lensemble verify`` recomputes it from the lines
(:meth:`BestReported.step`).

The last committed version is scored by nobody: no round trains on it. The choice is therefore
among the scored versions ``0 .. R-1`` of an ``R``-round run; the run says so
(:attr:`FinalChoice.why`). When no version was scored, the run ends with the last version.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from lensemble.federation.guard import REPORT, reports_of
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.set_aside import recorded_set_aside

#: The ledger key (in ``defences``) of each committed line's scoring.
ENTRY = "best_reported"


def _short(x: float) -> float:
    """6 significant digits (what the ledger keeps)."""
    return float(f"{x:.6g}")


def median_score(reports: Mapping[str, float | None], quorum: int) -> tuple[float | None, int]:
    """The median of the valid reports and how many there are (None below ``quorum``).

    Args:
        reports: Participant id -> its held-out loss of the version (unitless; None: none).
        quorum: The fewest valid reports that score a version (count, at least 1).

    Returns:
        ``(score, reporters)``: the median of the finite, non-negative reports at 6 significant
        digits, or None when fewer than ``quorum`` (and at least one) reported one.
    """
    valid = sorted(
        float(v) for v in reports.values() if v is not None and math.isfinite(v) and v >= 0
    )
    if not valid or len(valid) < quorum:
        return None, len(valid)
    return _short(statistics.median(valid)), len(valid)


@dataclass(frozen=True)
class BestState:
    """The best scored version so far.

    Attributes:
        version: Its index (None before any version was scored).
        model_hash: Its model hash.
        score: Its median report.
        scored: Versions scored so far (count).
    """

    version: int | None = None
    model_hash: str = ""
    score: float | None = None
    scored: int = 0


@dataclass(frozen=True)
class Scoring:
    """One version's score, and the best version it leads to.

    Attributes:
        version: The scored version (the round's index).
        score: Its median report, or None (unscored).
        reporters: Valid reports counted (count).
        quorum: The fewest that score a version (count).
        state: The best version after this one, should its round commit.
    """

    version: int
    score: float | None
    reporters: int
    quorum: int
    state: BestState

    def to_record(self) -> dict[str, Any]:
        """Plain JSON for the ledger's ``defences.best_reported``."""
        return {
            "version": self.version,
            "score": self.score,
            "reporters": self.reporters,
            "quorum": self.quorum,
            "best": self.state.version,
            "best_hash": self.state.model_hash,
            "best_score": self.state.score,
            "scored": self.state.scored,
        }


def kept_reports(
    reported: Mapping[str, Mapping[str, float | None]],
    contributors: Iterable[str],
    set_aside: Iterable[str],
) -> dict[str, float | None]:
    """The held-out reports that count: the contributors', less those set aside.

    Args:
        reported: Participant id -> its bounded self-reported statistics.
        contributors: The round's contributors (the updates the norm bound kept).
        set_aside: Whom the round set aside (named suspects, weight 0 in the mean).
    """
    aside = set(set_aside)
    out: dict[str, float | None] = {}
    for pid in sorted(contributors):
        if pid in aside:
            continue
        value = reported.get(pid, {}).get(REPORT)
        out[pid] = float(value) if isinstance(value, (int, float)) else None
    return out


class BestReported:
    """Scores each committed version and tracks the best (see the module docstring).

    Args:
        quorum: The fewest valid reports that score a version (``federation.quorum``).
        state: Where to continue from (nothing scored when None).
    """

    def __init__(self, quorum: int, state: BestState | None = None) -> None:
        self.quorum = max(1, quorum)
        self.state = state or BestState()

    def score(self, version: int, model_hash: str, reports: Mapping[str, float | None]) -> Scoring:
        """Score ``version`` from its kept contributors' reports (nothing applied).

        Args:
            version: The version the round trained from.
            model_hash: Its hash (remembered when it becomes the best).
            reports: Participant id -> its held-out loss of that version (None: no report).

        Returns:
            The scoring; :meth:`apply` it once the round commits.
        """
        score, reporters = median_score(reports, self.quorum)
        state = self.state
        if score is not None:
            scored = state.scored + 1
            if state.score is None or score < state.score:
                state = BestState(version, model_hash, score, scored)
            else:
                state = BestState(state.version, state.model_hash, state.score, scored)
        return Scoring(version, score, reporters, self.quorum, state)

    def apply(self, scoring: Scoring) -> None:
        """Make the best version a committed round's scoring leads to the current one."""
        self.state = scoring.state

    def step(self, record: RoundRecord) -> str | None:
        """Replay one ledger record: score its reports again and apply the result.

        Returns:
            None when the record's ``defences.best_reported`` is what its reports give (or it
            has none), else one sentence saying what differs.
        """
        recorded = record.defences.get(ENTRY)
        if record.state != "closed" or recorded is None:
            return None
        if not isinstance(recorded, dict):
            return f"round {record.round}'s best_reported entry is not an object"
        quorum = recorded.get("quorum")
        if isinstance(quorum, int) and not isinstance(quorum, bool) and quorum >= 1:
            self.quorum = quorum
        aside = set(recorded_set_aside(record))
        reports = {pid: v for pid, v in reports_of(record).items() if pid not in aside}
        scoring = self.score(record.round, record.parent_hash, reports)
        again = scoring.to_record()
        if again != recorded:
            keys = set(again) | set(recorded)
            differing = sorted(k for k in keys if again.get(k) != recorded.get(k))
            return (
                f"round {record.round}'s best reported version is not what its reports give "
                f"(differing: {', '.join(differing)})"
            )
        self.apply(scoring)
        return None

    @classmethod
    def replay(cls, quorum: int, records: Iterable[RoundRecord]) -> BestReported:
        """The tracker after the committed ``records`` (a resume continues from it).

        Raises:
            ValueError: A record's entry is not what its reports give (says which).
        """
        tracker = cls(quorum)
        for record in records:
            problem = tracker.step(record)
            if problem is not None:
                raise ValueError(problem)
        return tracker


@dataclass(frozen=True)
class FinalChoice:
    """Which committed version a run ends with, and why.

    Attributes:
        version: The version kept (the last one, or the best scored one).
        model_hash: Its model hash.
        last: The last committed version.
        score: Its median held-out report (None: unscored, the last version).
        why: One sentence for the run's summary.
    """

    version: int
    model_hash: str
    last: int
    score: float | None
    why: str

    @property
    def round(self) -> int | None:
        """The ledger's 0-based round that committed the kept version (None for version 0)."""
        return self.version - 1 if self.version > 0 else None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON for the run's summary."""
        return {
            "version": self.version,
            "round": self.round,
            "model_hash": self.model_hash,
            "last_version": self.last,
            "score": self.score,
            "why": self.why,
        }


def final_choice(state: BestState, last: int, last_hash: str) -> FinalChoice:
    """The version a ``best_reported`` run ends with, given the best state after its last round.

    Args:
        state: The tracker's state after the last committed round.
        last: The last committed version.
        last_hash: Its model hash.
    """
    if state.version is None or state.version == last:
        return FinalChoice(
            last,
            last_hash,
            last,
            None,
            f"kept the last version v{last}: no version was scored by a quorum of the "
            "participants' held-out reports",
        )
    return FinalChoice(
        state.version,
        state.model_hash,
        last,
        state.score,
        f"kept v{state.version} (committed by round {state.version - 1}) over the last, "
        f"v{last}: its median held-out loss reported by the participants, "
        f"{state.score:.4g}, is the lowest of the {state.scored} versions scored (the last "
        "version is scored by nobody, no round trains on it)"
        if state.version > 0
        else f"kept v0, the initial model, over the last, v{last}: its median held-out loss "
        f"reported by the participants, {state.score:.4g}, is the lowest of the "
        f"{state.scored} versions scored (the last version is scored by nobody)",
    )
