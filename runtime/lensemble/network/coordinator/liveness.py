"""Who the coordinator waits for: joined participants, their presence streams, grace periods.

Every joined participant holds a ``Presence`` stream open. A participant whose stream breaks
(its process died, its connection or keepalive failed) is absent at once; one whose stream ended
normally has ``rpc_timeout_s`` to open the next. The collection of an attempt ends as soon as
every participant still present has been judged and quorum is reached
(:meth:`Liveness.nobody_to_wait_for`): nobody waits ``round_timeout_s`` for a dead participant.
A participant absent at any moment of an attempt is not waited for in it, even when it rejoins
meanwhile (it contributes from the next opening).
"""

from __future__ import annotations

import logging

from lensemble.federation.messages import LEFT
from lensemble.network.coordinator.attempt_board import AttemptBoard
from lensemble.network.shared.logs import event

_log = logging.getLogger("lensemble.network.coordinator")


class Liveness:
    """Membership and presence of the run's participants, and who an attempt still waits for.

    Args:
        board: The transport's shared round state (and its lock).
        grace_s: How long a participant counts as present without a presence stream: after it
            joined, and after a stream ended at its window (``network.rpc_timeout_s``; seconds).
        quorum: ``federation.quorum``: an attempt closes early only once it has that many
            accepted updates.
    """

    def __init__(self, board: AttemptBoard, *, grace_s: float, quorum: int) -> None:
        self._board = board
        self.grace_s = grace_s
        self.quorum = quorum
        self._joined: set[str] = set()
        self._left: set[str] = set()
        self._present: dict[str, int] = {}
        self._grace_until: dict[str, float] = {}

    # ------------------------------------------------------------------------ membership
    def note_joined(self, participant: str) -> bool:
        """Count ``participant`` joined (caller holds the lock); True when it had joined before.

        It is present until its presence stream opens; an open attempt it was absent from still
        does not wait for it (it contributes from the next opening).
        """
        rejoin = participant in self._joined
        self._joined.add(participant)
        self._left.discard(participant)
        self._grace_until[participant] = self._board.now() + self.grace_s
        self._board.miss(participant, "joined_late")
        return rejoin

    def note_left(self, participant: str) -> None:
        """Count ``participant`` gone for good (caller holds the lock)."""
        self._left.add(participant)
        self._board.miss(participant, LEFT)

    def joined_count(self) -> int:
        """Participants joined and not left."""
        return len(self._joined - self._left)

    def wait_for_joined(self, timeout_s: float) -> set[str]:
        """Block until every participant joined or ``timeout_s`` passed; returns who joined.

        Raises:
            ShutdownRequested: The coordinator started stopping meanwhile.
        """
        board = self._board
        end = board.now() + timeout_s
        with board.cond:
            while not board.expected <= self._joined and board.now() < end:
                board.check_stop()
                board.cond.wait(max(0.0, end - board.now()))
            board.check_stop()
            return set(self._joined)

    def all_left(self) -> bool:
        """True once every participant that joined has left."""
        with self._board.cond:
            return self._joined <= self._left

    def wait_all_left(self, timeout_s: float) -> bool:
        """Wait until every joined participant left, at most ``timeout_s`` seconds."""
        board = self._board
        end = board.now() + timeout_s
        with board.cond:
            while not self._joined <= self._left and board.now() < end:
                board.cond.wait(max(0.0, end - board.now()))
            return self._joined <= self._left

    # -------------------------------------------------------------------------- presence
    def live(self, participant: str) -> bool:
        """Present now (caller holds the lock): joined, not left, a presence stream or grace."""
        if participant not in self._joined or participant in self._left:
            return False
        return self._present.get(participant, 0) > 0 or self._board.now() < self._grace_until.get(
            participant, 0.0
        )

    def why_absent(self, participant: str) -> str:
        """Ledger reason of a participant not present at an opening (caller holds the lock)."""
        if participant in self._left:
            return LEFT
        return "disconnected" if participant in self._joined else "not_joined"

    def absent_now(self) -> dict[str, str]:
        """Participant id -> why, of every participant not present now (caller holds the lock)."""
        return {p: self.why_absent(p) for p in self._board.expected if not self.live(p)}

    def presence_opened(self, participant: str) -> None:
        """A presence stream of ``participant`` opened."""
        with self._board.cond:
            self._present[participant] = self._present.get(participant, 0) + 1
            self._board.cond.notify_all()

    def presence_closed(self, participant: str, broken: bool) -> None:
        """A presence stream ended; ``broken``: it did not end at its window (peer gone).

        A broken stream makes the participant absent at once (unless another stream of it is
        open); a stream that ended at its window gives ``rpc_timeout_s`` to open the next.
        """
        board = self._board
        with board.cond:
            left = self._present.get(participant, 0) - 1
            if left > 0:
                self._present[participant] = left
                return
            self._present.pop(participant, None)
            if not broken:
                self._grace_until[participant] = board.now() + self.grace_s
                board.cond.notify_all()  # receive() now wakes when this grace ends
                return
            self._grace_until.pop(participant, None)
            if participant in self._left:
                return  # it said goodbye first: a closed stream is expected
            board.miss(participant, "disconnected")
            board.cond.notify_all()
        event(
            _log,
            "absent",
            f"{participant}'s connection broke; counted absent until it joins again.",
            logging.WARNING,
            participant=participant,
        )

    # ----------------------------------------------------------------- who to wait for
    def nobody_to_wait_for(self) -> bool:
        """True when the open attempt may close now: every live participant judged, quorum met."""
        board = self._board
        with board.cond:
            if board.opening is None:
                return False
            for participant in board.expected - board.missed - board.judged:
                if not self.live(participant):
                    board.miss(participant, self.why_absent(participant))
            waiting = board.expected - board.missed - board.judged
            done = not waiting and len(board.accepted) >= self.quorum
        if done:
            event(
                _log,
                "collection_complete",
                f"every present participant of round {board.collecting_round} was judged; "
                "closing without waiting for the absent.",
                absent=sorted(board.missed - board.judged),
            )
        return done

    def wake_in(self, remaining: float) -> float:
        """How long a wait for the next submission may sleep (seconds; the caller holds the lock).

        Until ``remaining`` runs out, or until the earliest grace period of a participant the
        open attempt waits for ends: the one change of liveness that no call announces.
        """
        board = self._board
        now = board.now()
        graces = [
            self._grace_until[p] - now
            for p in board.expected - board.missed - board.judged
            if self._present.get(p, 0) == 0 and self._grace_until.get(p, 0.0) > now
        ]
        return min([remaining, *graces])
