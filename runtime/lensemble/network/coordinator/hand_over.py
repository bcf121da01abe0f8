"""The hand-over between gRPC handler threads and the coordinator's thread: inbox and verdicts.

The federation :class:`~lensemble.federation.coordinator.Coordinator` stays single-threaded: a
handler thread queues each complete submission (:meth:`HandOver.submit`) and waits, with a
deadline, for the verdict; the coordinator's thread takes the submissions one at a time
(:meth:`HandOver.receive`) and answers each (:meth:`HandOver.reply`). No handler thread ever
holds the coordinator.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from lensemble.federation.messages import Reason, Submission, Verdict
from lensemble.network.coordinator.attempt_board import AttemptBoard
from lensemble.network.coordinator.liveness import Liveness
from lensemble.network.coordinator.rejection import Rejection
from lensemble.network.shared import transport_errors as nerr
from lensemble.network.shared.metrics import Metrics


@dataclass
class Pending:
    """A submission handed to the coordinator, and the answer its handler thread waits for."""

    submission: Submission
    compute_s: float
    done: threading.Event = field(default_factory=threading.Event)
    received_at: float = 0.0
    outcome: Verdict | Rejection | None = None

    def answer(self, outcome: Verdict | Rejection) -> None:
        """Hand ``outcome`` to the waiting handler thread."""
        self.outcome = outcome
        self.done.set()


class HandOver:
    """The queue of complete submissions and the verdicts that answer them.

    Args:
        board: The transport's shared round state (and its lock).
        liveness: Who the open attempt still waits for (ends a wait early).
        metrics: Where arrivals are counted.
    """

    def __init__(self, board: AttemptBoard, liveness: Liveness, metrics: Metrics) -> None:
        self._board = board
        self._liveness = liveness
        self._metrics = metrics
        self._inbox: deque[Pending] = deque()
        self._pending: dict[int, Pending] = {}
        self._up = 0
        self._compute = 0.0
        self._decode_s = 0.0

    def submit(
        self, submission: Submission, compute_s: float, timeout_s: float
    ) -> Verdict | Rejection:
        """Queue a complete submission for the coordinator and wait for its verdict.

        Returns:
            The coordinator's verdict, or a transport rejection when the round closed first,
            the coordinator is stopping, or no verdict came within ``timeout_s`` (``busy``).
        """
        board = self._board
        pending = Pending(submission, compute_s)
        with board.cond:
            if board.stopping:
                return Rejection(nerr.SHUTTING_DOWN, "the coordinator is shutting down.", -1)
            # The attempt may have closed while the update was streaming: the same rule again.
            early = board.admission(
                submission.sender,
                submission.round_index,
                submission.attempt,
                submission.payload_hash,
            )
            if early is None:
                self._inbox.append(pending)
                board.cond.notify_all()
        if early is not None:
            return early
        if not pending.done.wait(timeout_s) or pending.outcome is None:
            return Rejection(
                nerr.BUSY,
                f"the coordinator gave no verdict within network.rpc_timeout_s ({timeout_s} s); "
                "resend the same bytes.",
                board.collecting_round,
            )
        return pending.outcome

    def receive(self, until_s: float) -> Submission | None:
        """The next complete submission before ``until_s`` (monotonic), else None.

        Returns None early once nobody is left to wait for
        (:meth:`~lensemble.network.coordinator.liveness.Liveness.nobody_to_wait_for`).

        Raises:
            ShutdownRequested: The coordinator is stopping.
        """
        board = self._board
        with board.cond:
            while True:
                board.check_stop()
                remaining = until_s - board.now()
                if remaining <= 0:
                    return None
                if self._inbox:
                    pending = self._inbox.popleft()
                    break
                if self._liveness.nobody_to_wait_for():
                    return None
                board.cond.wait(self._liveness.wake_in(remaining))
            self._pending[id(pending.submission)] = pending
            self._up += len(pending.submission.payload)
            self._compute = max(self._compute, pending.compute_s)
            deadline = board.opening.deadline_s if board.opening else until_s
        self._metrics.submission_arrived(pending.submission.sender, deadline - board.now())
        pending.received_at = time.perf_counter()
        return pending.submission

    def reply(self, submission: Submission, verdict: Verdict) -> None:
        """Hand the verdict to the gRPC handler waiting for it."""
        board = self._board
        with board.cond:
            pending = self._pending.pop(id(submission), None)
            if verdict.reason == Reason.ACCEPTED:
                board.accepted[submission.sender] = submission.payload_hash
            if pending is not None:  # the coordinator decoded and checked it meanwhile
                self._decode_s += time.perf_counter() - pending.received_at
            if submission.sender in board.expected:
                board.judged.add(submission.sender)
            board.cond.notify_all()
        if pending is not None:
            pending.answer(verdict)

    def sends(self, participant: str) -> bool:
        """True when an update of ``participant`` is queued or being judged (lock held)."""
        waiting = [*self._inbox, *self._pending.values()]
        return any(pending.submission.sender == participant for pending in waiting)

    def take_leftovers(self) -> tuple[list[tuple[Pending, Verdict | Rejection | None]], float]:
        """Empty the queue once an attempt closed (caller holds the lock, after ``board.close``).

        Returns:
            Each queued submission with the closed attempt's rule applied to it, for
            :meth:`answer_leftovers`; and the seconds the coordinator spent decoding and
            checking the attempt's updates (the counter starts over).
        """
        leftovers = [
            (
                pending,
                self._board.admission(
                    pending.submission.sender,
                    pending.submission.round_index,
                    pending.submission.attempt,
                    pending.submission.payload_hash,
                ),
            )
            for pending in self._drain()
        ]
        decode_s, self._decode_s = self._decode_s, 0.0
        return leftovers, decode_s

    def answer_leftovers(self, leftovers: list[tuple[Pending, Verdict | Rejection | None]]) -> None:
        """Answer what :meth:`take_leftovers` took (without the lock).

        A queued resend of an update that was counted is answered ``duplicate`` (accepted), as
        the coordinator would answer it; anything else is refused. A refusal here would make the
        sender forget a round it contributed to.
        """
        for pending, outcome in leftovers:
            if isinstance(outcome, Verdict) and outcome.reason == Reason.DUPLICATE:
                pending.answer(outcome)
            else:
                self.refuse([pending], Reason.CLOSED_ROUND.value, "the round closed first.")

    def take_all(self) -> list[Pending]:
        """Every submission queued or being judged, forgotten (caller holds the lock)."""
        taken = self._drain() + list(self._pending.values())
        self._pending.clear()
        return taken

    def refuse(self, pendings: list[Pending], reason: str, message: str) -> None:
        """Answer each of ``pendings`` with a transport rejection."""
        for pending in pendings:
            pending.answer(Rejection(reason, message, self._board.collecting_round))

    def take_traffic(self) -> tuple[int, float]:
        """Update bytes received and the slowest contributor's compute (s) since the last call.

        The caller holds the lock.
        """
        traffic = (self._up, self._compute)
        self._up, self._compute = 0, 0.0
        return traffic

    def _drain(self) -> list[Pending]:
        with self._board.cond:
            out = list(self._inbox)
            self._inbox.clear()
            return out
