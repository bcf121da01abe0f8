"""The divergence guard: roll back to the best committed model when the participants vouch.

With its update for round ``t`` each participant reports ``L_i(t)``, the held-out loss of the
model it received (version ``t``) on its own held-out data (``heldout_loss`` metadata; bounded
and kept as self-reported in the ledger). The guard compares each round's model with the best
model judged so far, version ``b``, participant by participant, so sites whose losses differ by
orders of magnitude weigh the same::

    r_i = L_i(t) / L_i(b)        for every contributor that reported on both t and b

A round is **judged** when at least ``min_reporters`` contributors have such a ratio, and then:

- **degraded** when a strict majority of them has ``r_i > 1 + margin``: the model got worse by
  more than the margin for most sites, which no single liar can fake (nor, with f hostile of n
  and f < n / 2, hide: it needs the honest majority's reports either way);
- while degraded, the streak goes on as long as a strict majority still has
  ``r_i > 1 + margin / 2`` (hysteresis: a model hovering at the margin does not flip the
  decision every round);
- **improved** when it is not degraded and the median ratio is below 1: version ``t`` becomes
  the best one (the first judged round becomes the first best).

When the streak reaches ``patience`` judged rounds, the round does not aggregate: it commits a
**rollback**, a new version ``t + 1`` whose parameters and outer momentum are those of version
``b`` (the hash chain goes on; the model hash differs from ``b``'s only by its version and
parent), and records in the signed ledger why, the suspected participants
(:mod:`lensemble.federation.suspicion`) and the hash of ``b``. Every decision is plain JSON in
the committed ledger line (``guard``), a function of the earlier lines, so a resume replays it
(:meth:`DivergenceGuard.replay`) and ``lensemble verify`` checks it (:func:`replay_problem`).

The loss of the last committed model is reported by nobody (no round trains on it): the run's
summary says how the newest judged model compares with the best (:func:`summary`), and the
ledger keeps every judgement, so "keep the best committed round" can read the best version off
the last line (``guard.best``).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from lensemble.config.schema import DivergenceGuardConfig
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.suspicion import Suspicion, record_scores

#: The self-reported statistic the guard reads (``RoundRecord.self_reported``).
REPORT = "heldout_loss"


def _short(x: float) -> float:
    """6 significant digits (what the ledger keeps)."""
    return float(f"{x:.6g}")


@dataclass(frozen=True)
class GuardState:
    """What the guard carries from round to round.

    Attributes:
        best: The best judged version, or None before the first judged round.
        best_hash: Its model hash.
        best_reports: Participant id -> its report on the best version.
        streak: Consecutive judged rounds degraded (or holding) since the last reset.
        rollbacks: Rollbacks so far (count).
    """

    best: int | None = None
    best_hash: str = ""
    best_reports: dict[str, float] = field(default_factory=dict)
    streak: int = 0
    rollbacks: int = 0


@dataclass(frozen=True)
class Judgement:
    """The guard's verdict on one round's model, and the state it leads to.

    Attributes:
        version: The judged model version (the round's index).
        action: ``first``, ``improved``, ``steady``, ``degraded``, ``rollback`` or
            ``unjudged`` (fewer than ``min_reporters`` ratios).
        ratios: Participant id -> ``r_i`` (6 significant digits).
        state: The guard's state after this round, should it commit.
        why: For a rollback: one sentence saying why.
        suspects: For a rollback: the suspected participants, most suspicious first.
    """

    version: int
    action: str
    ratios: dict[str, float]
    state: GuardState
    why: str = ""
    suspects: tuple[str, ...] = ()

    @property
    def rollback(self) -> bool:
        """True when the round commits a rollback instead of its aggregate."""
        return self.action == "rollback"

    def to_record(self, settings: DivergenceGuardConfig, before: GuardState) -> dict[str, Any]:
        """Plain JSON for the ledger's ``guard`` field."""
        ratios = sorted(self.ratios.values())
        out: dict[str, Any] = {
            "version": self.version,
            "action": self.action,
            "ratios": dict(sorted(self.ratios.items())),
            "median_ratio": _short(statistics.median(ratios)) if ratios else None,
            "compared_with": before.best,
            "best": self.state.best,
            "best_hash": self.state.best_hash,
            "streak": self.state.streak,
            "rollbacks": self.state.rollbacks,
            "margin": settings.margin,
            "patience": settings.patience,
            "min_reporters": settings.min_reporters,
        }
        if self.rollback:
            out.update(
                rollback_to=before.best,
                rollback_hash=before.best_hash,
                suspects=list(self.suspects),
                why=self.why,
            )
        return out


def reports_of(record: RoundRecord) -> dict[str, float | None]:
    """Contributor id -> its held-out report in ``record`` (None when it reported none)."""
    out: dict[str, float | None] = {}
    for pid in record.contributors:
        value = record.self_reported.get(pid, {}).get(REPORT)
        out[pid] = float(value) if isinstance(value, (int, float)) else None
    return out


class DivergenceGuard:
    """Judges each round's model against the best one (see the module docstring).

    Args:
        settings: ``federation.robustness.guard``.
        state: Where to continue from (a fresh guard when None).
    """

    def __init__(self, settings: DivergenceGuardConfig, state: GuardState | None = None) -> None:
        self.settings = settings
        self.state = state or GuardState()

    def judge(
        self,
        version: int,
        model_hash: str,
        reports: Mapping[str, float | None],
        suspects: Iterable[str] = (),
    ) -> Judgement:
        """The verdict on model ``version`` from its contributors' reports (nothing applied).

        Args:
            version: The model the round trained from (its index).
            model_hash: Its hash (remembered when it becomes the best).
            reports: Contributor id -> its held-out loss of that model (None: no report).
            suspects: Who the suspicion scores name now, most suspicious first.

        Returns:
            The judgement; :meth:`apply` it once the round commits.
        """
        state, s = self.state, self.settings
        valid = {p: v for p, v in sorted(reports.items()) if v is not None and v >= 0}
        if state.best is None:
            if len(valid) < s.min_reporters:
                return Judgement(version, "unjudged", {}, state)
            best = replace(state, best=version, best_hash=model_hash, best_reports=valid)
            return Judgement(version, "first", {}, best)
        ratios = {
            p: _short(v / state.best_reports[p])
            for p, v in valid.items()
            if state.best_reports.get(p, 0.0) > 0
        }
        if len(ratios) < s.min_reporters:
            return Judgement(version, "unjudged", ratios, state)
        return self._verdict(version, model_hash, valid, ratios, tuple(suspects))

    def _verdict(
        self,
        version: int,
        model_hash: str,
        valid: dict[str, float],
        ratios: dict[str, float],
        suspects: tuple[str, ...],
    ) -> Judgement:
        """The verdict on a judged round (enough ratios)."""
        state, s = self.state, self.settings
        line = 1 + (s.margin / 2 if state.streak > 0 else s.margin)
        worse = sum(r > line for r in ratios.values())
        if 2 * worse > len(ratios):
            streak = state.streak + 1
            if streak < s.patience:
                return Judgement(version, "degraded", ratios, replace(state, streak=streak))
            why = (
                f"{worse} of {len(ratios)} participants report model v{version} worse than "
                f"the best judged model v{state.best} by more than "
                f"{s.margin:.0%} (median ratio {statistics.median(ratios.values()):.3g}), "
                f"{streak} judged round(s) in a row; rolled back to v{state.best}"
            )
            after = replace(state, streak=0, rollbacks=state.rollbacks + 1)
            return Judgement(version, "rollback", ratios, after, why, suspects)
        if statistics.median(ratios.values()) < 1:
            best = GuardState(version, model_hash, valid, 0, state.rollbacks)
            return Judgement(version, "improved", ratios, best)
        return Judgement(version, "steady", ratios, replace(state, streak=0))

    def apply(self, judgement: Judgement) -> None:
        """Make the state a committed round's judgement leads to the current one."""
        self.state = judgement.state

    @classmethod
    def replay(
        cls, settings: DivergenceGuardConfig, records: Iterable[RoundRecord]
    ) -> DivergenceGuard:
        """The guard after the committed ``records`` (a resume continues from it).

        Raises:
            ValueError: A record's ``guard`` entry is not the verdict its reports give
                (:func:`replay_problem` says which).
        """
        guard = cls(settings)
        for record in records:
            problem = guard.step(record)
            if problem is not None:
                raise ValueError(problem)
        return guard

    def step(self, record: RoundRecord) -> str | None:
        """Replay one ledger record: judge its reports again and apply the verdict.

        Returns:
            None when the record's ``guard`` entry is the verdict (or it has none and the
            guard did not judge), else one sentence saying what differs.
        """
        if record.state != "closed" or not record.guard:
            return None
        recorded = record.guard
        settings = _recorded_settings(recorded, self.settings)
        if settings != self.settings:
            self.settings = settings
        before = self.state
        scores = record_scores(record) or {}
        judgement = self.judge(
            record.round, record.parent_hash, reports_of(record), Suspicion().suspects(scores)
        )
        again = judgement.to_record(self.settings, before)
        if again != recorded:
            keys = set(again) | set(recorded)
            differing = sorted(k for k in keys if again.get(k) != recorded.get(k))
            return (
                f"round {record.round}'s divergence-guard verdict is not what its reports give "
                f"(differing: {', '.join(differing)})"
            )
        self.apply(judgement)
        return None


def _recorded_settings(
    recorded: Mapping[str, Any], current: DivergenceGuardConfig
) -> DivergenceGuardConfig:
    """The settings a ledger entry was judged with (those it records)."""
    try:
        return DivergenceGuardConfig(
            enabled=True,
            margin=recorded["margin"],
            patience=recorded["patience"],
            min_reporters=recorded["min_reporters"],
        )
    except (KeyError, ValueError, TypeError):
        return current


def summary(records: Iterable[RoundRecord]) -> dict[str, Any]:
    """What a run's summary says about divergence, from its ledger records.

    Returns:
        ``rollbacks`` (each ``{"round", "to_version", "suspects", "why"}``), ``suspects`` (every
        participant named, sorted), ``best_version`` (the best judged model, or None),
        ``last_judged_version`` and ``last_median_ratio`` (the newest judged model and its
        median ratio to the best then), and ``warning``: one sentence when the run rolled back
        or ends with its newest judged model worse than the best by more than the margin,
        else None.
    """
    rollbacks: list[dict[str, Any]] = []
    last: Mapping[str, Any] = {}
    for record in records:
        entry = record.guard if record.state == "closed" else {}
        if not entry:
            continue
        last = entry
        if entry.get("action") == "rollback":
            rollbacks.append(
                {
                    "round": record.round,
                    "to_version": entry.get("rollback_to"),
                    "suspects": list(entry.get("suspects", [])),
                    "why": entry.get("why", ""),
                }
            )
    suspects = sorted({p for r in rollbacks for p in r["suspects"]})
    ratio = last.get("median_ratio") if last.get("action") != "rollback" else None
    margin = last.get("margin")
    warning = None
    if rollbacks:
        named = f"; suspected: {', '.join(suspects)}" if suspects else "; no participant stood out"
        warning = f"the divergence guard rolled back {len(rollbacks)} time(s){named}"
    elif isinstance(ratio, (int, float)) and ratio > 1 + float(margin or 0):
        warning = (
            f"the newest judged model (v{last.get('version')}) is {ratio:.3g} x worse than the "
            f"best judged one (v{last.get('compared_with')}) by the participants' reports"
        )
    return {
        "rollbacks": rollbacks,
        "suspects": suspects,
        "best_version": last.get("best"),
        "last_judged_version": last.get("version"),
        "last_median_ratio": ratio,
        "warning": warning,
    }
