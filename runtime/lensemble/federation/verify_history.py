"""The history pass of verification: suspicion scores and guard verdicts replay from the lines.

Each committed line records the coordinator's per-participant suspicion scores
(``defences.suspicion``, :mod:`lensemble.federation.suspicion`) and the divergence guard's
verdict (``guard``, :mod:`lensemble.federation.guard`), both functions of what the earlier lines
and the line itself record (norms, cosines, the participants' held-out reports), and whom the
mean left out as a named suspect (``defences.set_aside``, :mod:`lensemble.federation.set_aside`),
a function of the previous committed line's scores and set-aside and of the line's
contributors. Replaying them line by line must give exactly what each line says; a rollback
must name, as its target, a model the chain committed (its hash at that version). Lines written
before these fields existed carry none and are skipped. A line with central differential privacy
(``defences.central_privacy``) must count its release right after the previous one and record
the epsilon Opacus' accountant gives for its own fields
(:func:`lensemble.federation.central_privacy.recorded_epsilon_problem`). A line's best reported
version (``defences.best_reported``, :mod:`lensemble.federation.keep_best`) must be what its
kept contributors' reports and the earlier lines give. A line whose updates were trained from
another model than its parent (``defences.trained_from``, :mod:`lensemble.federation.overlap`)
must name the model committed one version before that parent, by an outer step, not a rollback.

The suspicion rule gained a term on 2026-12-05 (the pull along the momentum); a ledger's scores
must follow one rule from its first line to its last, the current one or, for a ledger written
before, the one without that term, so an older run record still verifies.
"""

from __future__ import annotations

from typing import Any

from lensemble.config.schema import DivergenceGuardConfig
from lensemble.federation.guard import DivergenceGuard
from lensemble.federation.keep_best import BestReported
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.set_aside import recorded_set_aside, set_aside
from lensemble.federation.suspicion import Suspicion, record_scores


def _names(value: object) -> str:
    """Who a ``set_aside`` value names, for a sentence ("nobody" when empty)."""
    if isinstance(value, dict):
        return ", ".join(sorted(map(str, value))) or "nobody"
    return repr(value)


class HistoryReplay:
    """Replays suspicion and guard decisions over committed lines, in chain order.

    Attributes:
        hashes: Model hash of every version committed so far (index = version).
    """

    def __init__(self) -> None:
        # The suspicion rules the lines so far agree with: the current one, the one before
        # one round's evidence was capped, and the one before the pull term (older ledgers).
        # Each line drops those it contradicts.
        self.rules = [
            Suspicion(),
            Suspicion(capped=False),
            Suspicion(pull_evidence=False, capped=False),
        ]
        self.aside: list[str] = []  # whom the last committed line set aside
        self.guard = DivergenceGuard(DivergenceGuardConfig())
        self.best = BestReported(1)  # each line records the quorum it was scored with
        self.hashes: list[str] = []
        self.releases = 0  # central-privacy releases so far
        self.privacy: dict[str, Any] | None = None  # the newest central-privacy entry
        self.privacy_recomputed = True  # every entry's epsilon recomputed (Opacus present)
        self.rolled_back = False  # the last committed line was a rollback

    def check(self, record: RoundRecord) -> str | None:
        """Replay one line; None when it holds, else what does not (a clause for a break).

        Call for every line in order; aborted lines change nothing.
        """
        if not self.hashes:
            self.hashes.append(record.parent_hash)
        problem = self._trained_from(record) or self._central(record)
        if problem is not None or record.state != "closed":
            return problem
        self.rolled_back = record.guard.get("action") == "rollback"
        problem = (
            self._set_aside(record)
            or self._scores(record)
            or self._verdict(record)
            or self.best.step(record)
        )
        self.hashes.append(record.model_hash)
        return problem

    def _trained_from(self, record: RoundRecord) -> str | None:
        base = record.defences.get("trained_from")
        if base is None:
            return None
        if self.rolled_back or len(self.hashes) < 2 or base != self.hashes[-2]:
            return (
                f"round {record.round}'s updates were trained from {str(base)[:19]}..., not from "
                "the model an outer step committed one version before its parent"
            )
        return None

    def _central(self, record: RoundRecord) -> str | None:
        entry = record.defences.get("central_privacy")
        if not isinstance(entry, dict):
            return None
        # Imported here: verification of a ledger without central DP loads no torch.
        from lensemble.federation.central_privacy import recorded_epsilon_problem

        self.releases += 1
        self.privacy = dict(entry)
        if entry.get("releases") != self.releases:
            return (
                f"round {record.round} counts central-privacy release {entry.get('releases')} "
                f"where the ledger holds {self.releases}"
            )
        try:
            problem = recorded_epsilon_problem(entry)
        except ImportError:  # no Opacus here: the count is checked, the epsilon cannot be
            self.privacy_recomputed = False
            return None
        return None if problem is None else f"round {record.round}: {problem}"

    def _set_aside(self, record: RoundRecord) -> str | None:
        """The line's set-aside suspects against the scores before it (None: they agree)."""
        if "set_aside" not in record.defences:
            self.aside = []
            return None
        # Every rule still standing holds the scores the lines recorded.
        expected = set_aside(self.rules[0].scores, record.contributors, self.aside)
        self.aside = recorded_set_aside(record)
        if record.defences["set_aside"] != expected:
            return (
                f"round {record.round} sets aside {_names(record.defences['set_aside'])} from "
                f"its mean, but the scores before it name {_names(expected)}"
            )
        return None

    def _scores(self, record: RoundRecord) -> str | None:
        recorded = record_scores(record)
        if recorded is None:
            return None
        norms = record.defences.get("norms")
        cosines = record.defences.get("cosines")
        if not isinstance(norms, dict) or not isinstance(cosines, dict):
            return f"round {record.round} records suspicion scores without norms and cosines"
        standing = [rule for rule in self.rules if rule.updated(norms, cosines) == recorded]
        if not standing:
            return (
                f"round {record.round}'s suspicion scores are not what its norms and cosines give"
            )
        for rule in standing:
            rule.apply(recorded)
        self.rules = standing
        return None

    def _verdict(self, record: RoundRecord) -> str | None:
        problem = self.guard.step(record)
        if problem is not None or record.guard.get("action") != "rollback":
            return problem
        target = record.guard.get("rollback_to")
        if not isinstance(target, int) or not 0 <= target < len(self.hashes):
            return f"round {record.round} rolls back to v{target}, which the chain never committed"
        if record.guard.get("rollback_hash") != self.hashes[target]:
            return (
                f"round {record.round} rolls back to v{target} under another hash than the one "
                "the chain committed"
            )
        return None
