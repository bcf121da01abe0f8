"""When an attempt stops waiting for the participants that have not submitted: stragglers.

A round attempt collects until every participant is judged or ``federation.round_timeout_s``
passes. A participant that is alive but slow (its process stuck, its host swapping) would make
every round wait that long. So once quorum has submitted, the attempt waits for the rest only
until ``straggler_factor`` times the recent collection time after its opening, and never less
than ``straggler_min_s``; a participant still missing then is excluded as ``straggler``
(:data:`STRAGGLER`) and contributes again from the next round.

The recent collection time is the median, over the last :data:`RECENT_ROUNDS` committed rounds,
of each round's ``extra.collect_s`` in the ledger: the transport-clock seconds from the opening
to the last accepted update. Read from the ledger, it is the same for an uninterrupted run and
a resumed one; measured on the transport's clock, it is virtual and deterministic in process and
real over the network. A round cut short records only its in-time arrivals, so stragglers never
stretch the next cutoff. Until a committed round has recorded one there is no cutoff.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from lensemble.config.schema import FederationConfig
from lensemble.federation.attempt import Collection
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.messages import Reason, Verdict

#: ``RoundRecord.excluded`` reason of a participant the attempt stopped waiting for once
#: quorum had submitted.
STRAGGLER = "straggler"
#: ``RoundRecord.extra`` key: transport-clock seconds from the opening to the last accepted
#: update of the attempt.
COLLECT_KEY = "collect_s"
#: Committed rounds whose collection times make up the recent one.
RECENT_ROUNDS = 5


def recent_collect_s(history: Sequence[RoundRecord], rounds: int = RECENT_ROUNDS) -> float | None:
    """Median ``extra.collect_s`` (seconds) of the last ``rounds`` committed rounds having one.

    None when no committed round recorded one (a new run, or a ledger older than the key).
    """
    times: list[float] = []
    for record in reversed(history):
        value = record.extra.get(COLLECT_KEY) if record.state == "closed" else None
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            times.append(float(value))
            if len(times) == rounds:
                break
    return statistics.median(times) if times else None


def straggler_cutoff(
    federation: FederationConfig, opened_at: float, history: Sequence[RoundRecord]
) -> float | None:
    """Transport-clock time after which an attempt with quorum stops waiting, or None.

    Args:
        federation: ``straggler_factor`` (None: never) and ``straggler_min_s``.
        opened_at: The attempt's opening on the transport's clock (seconds).
        history: Every attempt of the run so far, oldest first.
    """
    if federation.straggler_factor is None:
        return None
    recent = recent_collect_s(history)
    if recent is None:
        return None
    return opened_at + max(federation.straggler_factor * recent, federation.straggler_min_s)


class Stragglers:
    """One attempt's straggler cutoff: until when it waits, and whom it excludes.

    Args:
        federation: ``straggler_factor``, ``straggler_min_s`` and ``quorum``.
        opened_at: The attempt's opening on the transport's clock (seconds).
        history: Every attempt of the run so far, oldest first.

    Attributes:
        opened_at: As given.
        cutoff: The transport-clock time after which the attempt, once it has quorum, stops
            waiting (None: it waits until its deadline).
        collect_s: Seconds from the opening to the last accepted update so far (None before
            one): the ledger's ``extra.collect_s``.
    """

    def __init__(
        self, federation: FederationConfig, opened_at: float, history: Sequence[RoundRecord]
    ) -> None:
        self.quorum = federation.quorum
        self.opened_at = opened_at
        self.cutoff = straggler_cutoff(federation, opened_at, history)
        self.collect_s: float | None = None

    def wait_until(self, col: Collection) -> float:
        """Until when collection waits for the next update (transport clock, seconds).

        The attempt's deadline; once quorum is accepted, the cutoff if that is earlier.
        """
        deadline = col.opening.deadline_s
        if self.cutoff is not None and len(col.norms) >= self.quorum:
            return min(deadline, self.cutoff)
        return deadline

    def judged(self, verdict: Verdict, now: float) -> Verdict:
        """Note when an update was accepted (``now``, transport clock); returns ``verdict``."""
        if verdict.reason == Reason.ACCEPTED:
            self.collect_s = now - self.opened_at
        return verdict

    def close(self, col: Collection, now: float) -> float | None:
        """Collection ended at ``now``: exclude the stragglers; returns :attr:`collect_s`.

        Whoever is unaccounted for is excluded as :data:`STRAGGLER` only when quorum was in
        and the cutoff, not the deadline, ended collection; a participant the transport knows
        to be absent (``col.rejected`` already names why) keeps its reason.
        """
        cut = self.cutoff is not None and self.cutoff <= now < col.opening.deadline_s
        if cut and len(col.norms) >= self.quorum:
            for pid in col.expected - set(col.norms) - set(col.rejected):
                col.rejected[pid] = STRAGGLER
        return self.collect_s
