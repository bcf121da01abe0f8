"""The round state every piece of the coordinator transport reads and writes, under one lock.

The transport's pieces (:mod:`~lensemble.network.coordinator.admission`,
:mod:`~lensemble.network.coordinator.uploads`, :mod:`~lensemble.network.coordinator.hand_over`,
:mod:`~lensemble.network.coordinator.liveness`) each keep their own bookkeeping, but they decide
about the same attempt: which one is open, who was judged in it, who is not waited for and why.
That state lives here, with the one condition every change of it notifies: a waiter wakes on the
event itself, never on a polling interval.
"""

from __future__ import annotations

import threading
import time

from lensemble.federation.admission import ClosedAttempt, admit_attempt
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.messages import RoundOpening, Verdict
from lensemble.network.coordinator.rejection import Rejection, as_outcome
from lensemble.network.shared import transport_errors as nerr
from lensemble.network.shared.transport_errors import ShutdownRequested


class AttemptBoard:
    """The open attempt (or none), the one that closed last, and who stands where in them.

    Every attribute is read and written with :attr:`cond` held; so are the methods, unless they
    say otherwise (the condition's lock is re-entrant).

    Args:
        expected: The run's participant ids.
        next_round: The round the coordinator will open next.

    Attributes:
        cond: The one condition of the transport: held for every read and write, notified on
            every change.
        expected: The run's participant ids.
        opening: The attempt being collected, or None between attempts.
        payload: The open attempt's model payload (``b""`` between attempts).
        next_round: The round to open next once the open one closed.
        closed: The attempt that closed last, with the updates counted in it.
        final: The run is over (watchers get the final announcement).
        stopping: The coordinator is shutting down (SIGTERM).
        accepted: Participant id -> payload hash of each update accepted in the open attempt.
        judged: Participants the open attempt no longer waits for an update from: judged, or
            refused for good, or sitting it out.
        missed: Participants the open attempt does not wait for: absent at some moment of it.
        absence: Why each participant missing from the open attempt is missing (the ledger's
            words, see :meth:`GrpcCoordinatorTransport.absence_reasons`).
        abstained: Participant id -> why it sits out the open attempt (``Abstain``).
        closed_abstained: The same for the attempt that closed last (so a repeat whose reply
            was lost is still a duplicate).
    """

    def __init__(self, expected: frozenset[str], next_round: int) -> None:
        self.cond = threading.Condition()
        self.expected = expected
        self.opening: RoundOpening | None = None
        self.payload = b""
        self.next_round = next_round
        self.closed: ClosedAttempt | None = None
        self.final = False
        self.stopping = False
        self.accepted: dict[str, str] = {}
        self.judged: set[str] = set()
        self.missed: set[str] = set()
        self.absence: dict[str, str] = {}
        self.abstained: dict[str, str] = {}
        self.closed_abstained: dict[str, str] = {}

    @staticmethod
    def now() -> float:
        """Monotonic clock (seconds)."""
        return time.monotonic()

    @property
    def collecting_round(self) -> int:
        """The round being collected, or the next one to open (no lock needed)."""
        opening = self.opening
        return opening.round_index if opening is not None else self.next_round

    def check_stop(self) -> None:
        """Raise when the coordinator is stopping.

        Raises:
            ShutdownRequested: The transport's ``request_stop`` was called.
        """
        if self.stopping:
            raise ShutdownRequested("the coordinator is shutting down (SIGTERM);")

    def is_open(self, round_index: int, attempt: int) -> bool:
        """True when ``(round_index, attempt)`` is the attempt being collected."""
        opening = self.opening
        return opening is not None and (opening.round_index, opening.attempt) == (
            round_index,
            attempt,
        )

    def open(self, opening: RoundOpening, payload: bytes, absent: dict[str, str]) -> None:
        """Start collecting ``opening``; ``absent``: who is not waited for in it, and why."""
        self.opening, self.payload = opening, payload
        self.accepted = {}
        self.judged = set()
        self.abstained = {}
        self.missed = set(absent)
        self.absence = dict(absent)

    def close(self, record: RoundRecord) -> None:
        """Stop collecting the attempt of ``record``; remember what was counted in it."""
        self.closed = ClosedAttempt(record.round, record.attempt, dict(self.accepted))
        self.closed_abstained, self.abstained = self.abstained, {}
        self.opening, self.payload = None, b""
        if record.state == "closed":
            self.next_round = record.round + 1

    def miss(self, participant: str, reason: str) -> None:
        """The open attempt stops waiting for ``participant`` (``reason`` unless one stands).

        Nothing changes between attempts, or once the participant was judged in the open one.
        """
        if self.opening is not None and participant not in self.judged:
            self.missed.add(participant)
            self.absence.setdefault(participant, reason)

    def admission(
        self, sender: str, round_index: int, attempt: int, payload_hash: str
    ) -> Verdict | Rejection | None:
        """The ``(round, attempt)`` rule for an update, judged from its header alone.

        The coordinator's own rule (:func:`~lensemble.federation.admission.admit_attempt`),
        then the sender's abstention from the open attempt.

        Returns:
            None to take the update (it is for the open attempt); an accepted ``DUPLICATE``
            verdict for a resend of an update counted in the attempt that just closed; or a
            rejection (``closed_round``, or ``abstained`` for an attempt its sender sits out).
        """
        verdict = admit_attempt(
            sender,
            round_index,
            attempt,
            payload_hash,
            opening=self.opening,
            closed=self.closed,
            current_round=self.collecting_round,
        )
        if verdict is not None:
            return as_outcome(verdict)
        return self.abstained_from(sender, round_index, attempt)

    def abstained_from(self, participant: str, round_index: int, attempt: int) -> Rejection | None:
        """The refusal of an update for an attempt its sender sits out, else None."""
        if not self.is_open(round_index, attempt):
            return None
        reason = self.abstained.get(participant)
        if reason is None:
            return None
        return Rejection(
            nerr.ABSTAINED,
            f"'{participant}' sits out round {round_index} attempt {attempt} ({reason}); an "
            "update for it is not taken.",
            self.collecting_round,
        )
