"""The coordinator side of the network transport: a ``CoordinatorTransport`` over gRPC.

The federation :class:`~lensemble.federation.coordinator.Coordinator` stays single-threaded and
unchanged: it drives :class:`GrpcCoordinatorTransport` exactly as it drives the in-process
transport. gRPC handler threads (:class:`CoordinatorService`) never touch the coordinator; they
authenticate the caller, stream payloads in and out, and hand each complete submission to the
coordinator's thread through a queue, then wait (with a deadline) for its verdict.

Liveness: every joined participant holds a ``Presence`` stream open. A participant whose stream
breaks (its process died, its connection or keepalive failed) is absent at once; one whose
stream ended normally has ``rpc_timeout_s`` to open the next. :meth:`receive` ends the
collection of an attempt as soon as every participant still present has been judged and quorum
is reached: nobody waits ``round_timeout_s`` for a dead participant. A participant absent at any
moment of an attempt is not waited for in it, even when it rejoins meanwhile (it contributes
from the next opening).

What the transport decides on its own, before the coordinator sees anything (so a hostile or
broken participant costs at most ``network.max_message_bytes`` of memory and never stalls a
round): the caller's identity (``PERMISSION_DENIED``), the coordinator session
(``FAILED_PRECONDITION``, reason ``stale_session``), the round and attempt
(``FAILED_PRECONDITION``, reason ``closed_round``: the coordinator's own rule,
:func:`~lensemble.federation.coordinator.admit_attempt`, applied early), the declared and
received sizes (``RESOURCE_EXHAUSTED`` / ``INVALID_ARGUMENT``), and abstentions
(:meth:`GrpcCoordinatorTransport.abstain`: a participant sitting out the open attempt for a
reason of ``ABSTENTION_REASONS``, recorded as the in-process transport records it). Everything
else (hash, safetensors header, architecture, NaN/Inf, duplicates) is the coordinator's
:meth:`Coordinator.accept`. Every
rejection is counted in the ``lensemble_rejected_submissions_total`` metric by reason.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import grpc

from lensemble import __version__
from lensemble.config import LensembleConfig, config_hash
from lensemble.config.hashing import differing_paths, hashed_view
from lensemble.federation.coordinator import ClosedAttempt, admit_attempt
from lensemble.federation.intake import Intake
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.messages import (
    ABSTENTION_REASONS,
    LEFT,
    Reason,
    RoundOpening,
    Submission,
    Verdict,
)
from lensemble.federation.transport import CoordinatorTransport, Traffic
from lensemble.network.shared import transport_errors as nerr
from lensemble.network.shared.logs import event
from lensemble.network.shared.metrics import Metrics
from lensemble.network.shared.peer_text import shown, shown_all
from lensemble.network.shared.transport_errors import ShutdownRequested

_log = logging.getLogger("lensemble.network.coordinator")

#: gRPC status of each rejection reason (``Reason`` values and transport reasons).
STATUS_OF_REASON: dict[str, grpc.StatusCode] = {
    Reason.UNKNOWN_PARTICIPANT.value: grpc.StatusCode.PERMISSION_DENIED,
    nerr.BAD_CREDENTIALS: grpc.StatusCode.PERMISSION_DENIED,
    Reason.CLOSED_ROUND.value: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.STALE_BASE.value: grpc.StatusCode.FAILED_PRECONDITION,
    nerr.STALE_SESSION: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.HASH_MISMATCH.value: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.BAD_PAYLOAD.value: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.ARCHITECTURE_MISMATCH.value: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.NON_FINITE.value: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.CONFLICTING_DUPLICATE.value: grpc.StatusCode.ALREADY_EXISTS,
    Reason.TOO_LARGE.value: grpc.StatusCode.RESOURCE_EXHAUSTED,
    nerr.SHUTTING_DOWN: grpc.StatusCode.UNAVAILABLE,
    nerr.BUSY: grpc.StatusCode.UNAVAILABLE,
    nerr.TOO_MANY_CALLS: grpc.StatusCode.RESOURCE_EXHAUSTED,
    nerr.UNKNOWN_ABSTENTION: grpc.StatusCode.INVALID_ARGUMENT,
    nerr.ALREADY_SUBMITTED: grpc.StatusCode.FAILED_PRECONDITION,
    nerr.ABSTAINED: grpc.StatusCode.FAILED_PRECONDITION,
}


@dataclass(frozen=True)
class Rejection:
    """A call the transport refuses: the gRPC status, the reason label and one sentence."""

    reason: str
    message: str
    current_round: int

    @property
    def status(self) -> grpc.StatusCode:
        """The gRPC status code for :attr:`reason`."""
        return STATUS_OF_REASON.get(self.reason, grpc.StatusCode.INVALID_ARGUMENT)


def _as_outcome(verdict: Verdict) -> Verdict | Rejection:
    """An accepted verdict as it is; a refusal as a transport rejection (with its gRPC status)."""
    if verdict.accepted:
        return verdict
    return Rejection(verdict.reason.value, verdict.message, verdict.current_round)


@dataclass
class _Pending:
    submission: Submission
    compute_s: float
    done: threading.Event = field(default_factory=threading.Event)
    received_at: float = 0.0
    outcome: Verdict | Rejection | None = None


@dataclass(frozen=True)
class Abstention:
    """An abstention the transport took (see ``AbstainReply`` in the proto).

    Attributes:
        duplicate: A repeat of an abstention already recorded (changes nothing).
        current_round: The round the coordinator is collecting, or the next one.
    """

    duplicate: bool
    current_round: int


@dataclass(frozen=True)
class JoinOutcome:
    """The coordinator's answer to a Join (see ``JoinReply`` in the proto)."""

    accepted: bool
    message: str
    differing: list[str]
    collecting_round: int
    round_open: bool
    collecting_attempt: int
    already_submitted: bool
    run_over: bool


class GrpcCoordinatorTransport(CoordinatorTransport):
    """Coordinator transport whose participants are remote processes.

    Args:
        config: The run's config.
        next_round: The round the coordinator will open next (its model version).
        metrics: Where to count bytes and rejections (a private set by default).

    Attributes:
        session: Random id of this coordinator process, returned by Join and required in every
            later call, so participants notice a restarted coordinator.
        intake: Where the handler threads land update streams (the coordinator attaches its
            own before the first round; until then, in memory).
    """

    def __init__(
        self, config: LensembleConfig, *, next_round: int, metrics: Metrics | None = None
    ) -> None:
        self.config = config
        self.config_hash = config_hash(config)
        self.expected = frozenset(config.participant_ids)
        self.metrics = metrics or Metrics()
        self.session = secrets.token_hex(8)
        self.intake = Intake()
        # One condition for every state change: a waiter wakes on the event itself, never on a
        # polling interval (each change below notifies; see _wake_in for the one timed wake).
        self._cond = threading.Condition()
        self._inbox: deque[_Pending] = deque()
        self._pending: dict[int, _Pending] = {}
        self._joined: set[str] = set()
        self._left: set[str] = set()
        self._opening: RoundOpening | None = None
        self._payload = b""
        self._next_round = next_round
        self._accepted: dict[str, str] = {}
        self._closed: ClosedAttempt | None = None
        self._final = False
        self._stopping = False
        self._uploading: set[str] = set()
        self._down = self._up = 0
        self._compute = 0.0
        self._decode_s = 0.0
        self.metrics.federation(sorted(self.expected), config.federation.quorum)
        self.metrics.model_version.set(next_round)
        # Liveness (see the module docstring).
        self._present: dict[str, int] = {}
        self._grace_until: dict[str, float] = {}
        self._missed: set[str] = set()
        self._judged: set[str] = set()
        self._absence: dict[str, str] = {}
        # Participant id -> why it sits out the open attempt (Abstain), and the same for the
        # attempt that closed last (so a repeat whose reply was lost is still a duplicate).
        self._abstained: dict[str, str] = {}
        self._closed_abstained: dict[str, str] = {}
        self.grace_s = config.network.rpc_timeout_s
        self.quorum = config.federation.quorum

    # ------------------------------------------------------------ CoordinatorTransport
    def now(self) -> float:
        """Monotonic clock (seconds)."""
        return time.monotonic()

    def _check_stop(self) -> None:
        if self._stopping:
            raise ShutdownRequested("the coordinator is shutting down (SIGTERM);")

    def attach(self, intake: Intake) -> None:
        """Land update streams through the coordinator's ``intake`` from now on."""
        self.intake = intake

    def wait_for_participants(self, quorum: int, timeout_s: float) -> set[str]:
        """Block until every participant joined or ``timeout_s`` passed; returns who joined.

        Raises:
            ShutdownRequested: :meth:`request_stop` was called meanwhile.
        """
        end = self.now() + timeout_s
        with self._cond:
            while not self.expected <= self._joined and self.now() < end:
                self._check_stop()
                self._cond.wait(max(0.0, end - self.now()))
            self._check_stop()
            joined = set(self._joined)
        outcome = "starting rounds" if len(joined) >= quorum else f"below quorum ({quorum})"
        event(
            _log,
            "participants_joined",
            f"{len(joined)} of {len(self.expected)} participants joined; {outcome}.",
            joined=sorted(joined),
        )
        return joined

    def open_round(self, opening: RoundOpening, model_payload: bytes) -> None:
        """Publish the opening to every watcher and serve its model payload.

        Raises:
            ShutdownRequested: The coordinator is stopping; the round is not opened.
        """
        with self._cond:
            self._check_stop()
            self._opening, self._payload = opening, model_payload
            self._accepted = {}
            self._judged = set()
            self._abstained = {}
            self._missed = {p for p in self.expected if not self._live(p)}
            self._absence = {p: self._why_absent(p) for p in self._missed}
            self._cond.notify_all()
        self.metrics.round_opened(opening.round_index, opening.attempt)
        event(
            _log,
            "round_opened",
            f"round {opening.round_index} attempt {opening.attempt} open: model "
            f"{opening.model_hash[:19]}..., {len(model_payload)} bytes.",
            round=opening.round_index,
            attempt=opening.attempt,
            model_hash=opening.model_hash,
            model_bytes=len(model_payload),
        )

    def receive(self, until_s: float) -> Submission | None:
        """The next complete submission before ``until_s`` (monotonic), else None.

        Raises:
            ShutdownRequested: :meth:`request_stop` was called; the open round is abandoned
                (nothing was committed; a restarted coordinator reopens it).
        """
        with self._cond:
            while True:
                self._check_stop()
                remaining = until_s - self.now()
                if remaining <= 0:
                    return None
                if self._inbox:
                    pending = self._inbox.popleft()
                    break
                if self._nobody_to_wait_for():
                    return None
                self._cond.wait(self._wake_in(remaining))
            self._pending[id(pending.submission)] = pending
            self._up += len(pending.submission.payload)
            self._compute = max(self._compute, pending.compute_s)
            deadline = self._opening.deadline_s if self._opening else until_s
        self.metrics.submission_arrived(pending.submission.sender, deadline - self.now())
        pending.received_at = time.perf_counter()
        return pending.submission

    def _wake_in(self, remaining: float) -> float:
        """How long :meth:`receive` may sleep (seconds; the caller holds the lock).

        Until ``remaining`` runs out, or until the earliest grace period of a participant it
        waits for ends: the one change of liveness that no call announces.
        """
        now = self.now()
        graces = [
            self._grace_until[p] - now
            for p in self.expected - self._missed - self._judged
            if self._present.get(p, 0) == 0 and self._grace_until.get(p, 0.0) > now
        ]
        return min([remaining, *graces])

    def reply(self, submission: Submission, verdict: Verdict) -> None:
        """Hand the verdict to the gRPC handler waiting for it."""
        with self._cond:
            pending = self._pending.pop(id(submission), None)
            if verdict.reason == Reason.ACCEPTED:
                self._accepted[submission.sender] = submission.payload_hash
            if pending is not None:  # the coordinator decoded and checked it meanwhile
                self._decode_s += time.perf_counter() - pending.received_at
            if submission.sender in self.expected:
                self._judged.add(submission.sender)
            self._cond.notify_all()
        if pending is not None:
            pending.outcome = verdict
            pending.done.set()

    def round_closed(self, record: RoundRecord) -> None:
        """Stop collecting: answer whatever is still queued for the closed attempt.

        A queued resend of an update that was counted is answered ``duplicate`` (accepted), as
        the coordinator would answer it (:func:`admit_attempt`); anything else is refused. A
        refusal here would make the sender forget a round it contributed to.
        """
        with self._cond:
            self._closed = ClosedAttempt(record.round, record.attempt, dict(self._accepted))
            self._closed_abstained, self._abstained = self._abstained, {}
            self._opening, self._payload = None, b""
            if record.state == "closed":
                self._next_round = record.round + 1
            leftovers = [
                (
                    p,
                    admit_attempt(
                        p.submission.sender,
                        p.submission.round_index,
                        p.submission.attempt,
                        p.submission.payload_hash,
                        opening=None,
                        closed=self._closed,
                        current_round=self.collecting_round,
                    ),
                )
                for p in self._drain()
            ]
            decode_s, self._decode_s = self._decode_s, 0.0
        for pending, verdict in leftovers:
            if verdict is not None and verdict.reason == Reason.DUPLICATE:
                pending.outcome = _as_outcome(verdict)
                pending.done.set()
            else:
                self._refuse_pending(pending, Reason.CLOSED_ROUND.value, "the round closed first.")
        self.metrics.round_closed(record, sorted(self.expected), deserialize_s=decode_s)

    def round_durable(self, record: RoundRecord) -> None:
        """The attempt's ledger line is durable: committed-round metrics move now.

        Called from the coordinator's commit thread when it writes commits behind.
        """
        self.metrics.round_committed(record)

    def take_traffic(self) -> Traffic:
        """Model bytes streamed, update bytes received, and the slowest contributor's compute."""
        with self._cond:
            traffic = Traffic(self._down, self._up, self._compute)
            self._down = self._up = 0
            self._compute = 0.0
        return traffic

    def finish(self) -> None:
        """The run is over: watchers receive the final announcement."""
        with self._cond:
            self._final = True
            self._cond.notify_all()
        event(_log, "run_over", "all rounds committed; participants may leave.")

    # -------------------------------------------------------------------------- liveness
    def _live(self, participant: str) -> bool:
        """Present now (caller holds the lock): joined, not left, a presence stream or grace."""
        if participant not in self._joined or participant in self._left:
            return False
        return self._present.get(participant, 0) > 0 or self.now() < self._grace_until.get(
            participant, 0.0
        )

    def _why_absent(self, participant: str) -> str:
        """Ledger reason of a participant not present at an opening (caller holds the lock)."""
        if participant in self._left:
            return LEFT
        return "disconnected" if participant in self._joined else "not_joined"

    def _nobody_to_wait_for(self) -> bool:
        """True when the open attempt may close now: every live participant judged, quorum met."""
        with self._cond:
            if self._opening is None:
                return False
            for participant in self.expected - self._missed - self._judged:
                if not self._live(participant):
                    self._missed.add(participant)
                    self._absence.setdefault(participant, self._why_absent(participant))
            waiting = self.expected - self._missed - self._judged
            done = not waiting and len(self._accepted) >= self.quorum
        if done:
            event(
                _log,
                "collection_complete",
                f"every present participant of round {self._opening_round()} was judged; "
                "closing without waiting for the absent.",
                absent=sorted(self._missed - self._judged),
            )
        return done

    def _opening_round(self) -> int:
        opening = self._opening
        return opening.round_index if opening is not None else self._next_round

    def presence_opened(self, participant: str) -> None:
        """A presence stream of ``participant`` opened."""
        with self._cond:
            self._present[participant] = self._present.get(participant, 0) + 1
            self._cond.notify_all()

    def presence_closed(self, participant: str, broken: bool) -> None:
        """A presence stream ended; ``broken``: it did not end at its window (peer gone).

        A broken stream makes the participant absent at once (unless another stream of it is
        open); a stream that ended at its window gives ``rpc_timeout_s`` to open the next.
        """
        with self._cond:
            left = self._present.get(participant, 0) - 1
            if left > 0:
                self._present[participant] = left
                return
            self._present.pop(participant, None)
            if not broken:
                self._grace_until[participant] = self.now() + self.grace_s
                self._cond.notify_all()  # receive() now wakes when this grace ends
                return
            self._grace_until.pop(participant, None)
            if participant in self._left:
                return  # it said goodbye first: a closed stream is expected
            opening = self._opening
            if opening is not None and participant not in self._judged:
                self._missed.add(participant)
                self._absence.setdefault(participant, "disconnected")
            self._cond.notify_all()
        event(
            _log,
            "absent",
            f"{participant}'s connection broke; counted absent until it joins again.",
            logging.WARNING,
            participant=participant,
        )

    def upload_refused(self, participant: str, round_index: int, attempt: int, reason: str) -> None:
        """The transport refused an upload of ``participant`` for good (it will not resend).

        The open attempt no longer waits for it, and its ledger entry can name ``reason``.
        """
        with self._cond:
            opening = self._opening
            if opening is None or (opening.round_index, opening.attempt) != (round_index, attempt):
                return
            if participant in self._abstained:
                return  # it sits the attempt out: its stated reason stands
            if participant in self.expected and participant not in self._accepted:
                self._judged.add(participant)
                self._absence[participant] = reason
                self._cond.notify_all()

    def abstain(
        self, participant: str, round_index: int, attempt: int, reason: str
    ) -> Abstention | Rejection:
        """Record that ``participant`` sits out the open attempt, for ``reason``.

        The caller (the ``Abstain`` handler) authenticated ``participant`` as the caller's own
        identity and checked its session. Everything else is checked here, and a refusal
        changes nothing: the reason must be one of ``ABSTENTION_REASONS``; the attempt must be
        the open one; a participant that sent an update for it (accepted, rejected, queued or
        still streaming) cannot sit it out. A repeat with the same reason, in the open attempt
        or the one that just closed, is a duplicate (idempotent). Once recorded, the open
        attempt no longer waits for the participant, the ledger names ``reason`` (exactly as
        the in-process transport's ``absence_reasons``), and an update it sends for the attempt
        is refused (reason ``abstained``).

        Args:
            participant: The authenticated participant id.
            round_index: Round the participant says it sits out.
            attempt: Attempt of that round.
            reason: Why (peer text: checked against the vocabulary before any use).

        Returns:
            An :class:`Abstention`, or a :class:`Rejection` carrying the gRPC status:
            ``INVALID_ARGUMENT`` (``unknown_abstention``), ``PERMISSION_DENIED``
            (``unknown_participant``), ``FAILED_PRECONDITION`` (``closed_round``,
            ``already_submitted``), ``ALREADY_EXISTS`` (``conflicting_duplicate``: another
            reason was recorded).
        """
        current = self.collecting_round
        if reason not in ABSTENTION_REASONS:
            return Rejection(
                nerr.UNKNOWN_ABSTENTION,
                f"abstention reason {shown(reason[:64])!r} is not one of "
                f"{', '.join(sorted(ABSTENTION_REASONS))}; send one of those.",
                current,
            )
        with self._cond:
            current = self.collecting_round
            if participant not in self.expected:
                return Rejection(
                    Reason.UNKNOWN_PARTICIPANT.value,
                    f"'{shown(participant[:64])}' is not a participant of this run.",
                    current,
                )
            opening = self._opening
            key = (round_index, attempt)
            if opening is None or key != (opening.round_index, opening.attempt):
                closed = self._closed
                if (
                    closed is not None
                    and key == (closed.round_index, closed.attempt)
                    and self._closed_abstained.get(participant) == reason
                ):
                    return Abstention(True, current)
                state = (
                    f"round {opening.round_index} attempt {opening.attempt} is open"
                    if opening is not None
                    else "no round is open"
                )
                return Rejection(
                    Reason.CLOSED_ROUND.value,
                    f"round {round_index} attempt {attempt} is not being collected; {state}.",
                    current,
                )
            earlier = self._abstained.get(participant)
            if earlier == reason:
                return Abstention(True, current)
            if earlier is not None:
                return Rejection(
                    Reason.CONFLICTING_DUPLICATE.value,
                    f"'{participant}' already sits out round {round_index} attempt {attempt} "
                    f"for {earlier}; an abstention is recorded once.",
                    current,
                )
            if self._sent_update(participant):
                return Rejection(
                    nerr.ALREADY_SUBMITTED,
                    f"'{participant}' already sent an update for round {round_index} attempt "
                    f"{attempt}; it cannot sit that attempt out.",
                    current,
                )
            self._abstained[participant] = reason
            self._judged.add(participant)
            self._absence[participant] = reason
            self._cond.notify_all()
        event(
            _log,
            "abstained",
            f"{participant} sits out round {round_index} attempt {attempt} ({reason}).",
            participant=participant,
            round=round_index,
            attempt=attempt,
            reason=reason,
        )
        return Abstention(False, current)

    def _sent_update(self, participant: str) -> bool:
        """True when ``participant`` sent an update for the open attempt (caller holds the lock).

        Judged (accepted, rejected, or refused by the transport), queued, being judged, or still
        streaming.
        """
        if participant in self._judged or participant in self._uploading:
            return True
        waiting = [*self._inbox, *self._pending.values()]
        return any(pending.submission.sender == participant for pending in waiting)

    def _abstained_from(self, participant: str, round_index: int, attempt: int) -> Rejection | None:
        """The refusal of an update for an attempt its sender sits out (caller holds the lock)."""
        opening = self._opening
        if opening is None or (round_index, attempt) != (opening.round_index, opening.attempt):
            return None
        reason = self._abstained.get(participant)
        if reason is None:
            return None
        return Rejection(
            nerr.ABSTAINED,
            f"'{participant}' sits out round {round_index} attempt {attempt} ({reason}); an "
            "update for it is not taken.",
            self.collecting_round,
        )

    def absence_reasons(self) -> dict[str, str]:
        """Why participants missing from the open (or just closed) attempt are missing.

        ``disconnected`` (its presence stream broke, or it was gone at the opening),
        ``not_joined``, ``left``, ``joined_late`` (it joined while the attempt was open and
        contributes from the next), a transport refusal such as ``too_large``, or the reason
        the participant gave for sitting the attempt out (:meth:`abstain`: ``rank_failure``).
        Participants not listed were present and simply did not submit in time.
        """
        with self._cond:
            return dict(self._absence)

    # ------------------------------------------------------------------- process control
    def request_stop(self) -> None:
        """Stop gracefully (SIGTERM): the coordinator's thread raises ``ShutdownRequested``.

        Queued submissions and waiting handlers are answered ``UNAVAILABLE`` (reason
        ``shutting_down``), so participants resend to the restarted coordinator.
        """
        with self._cond:
            self._stopping = True
            leftovers = self._drain()
            waiting = list(self._pending.values())
            self._pending.clear()
            self._cond.notify_all()
        for pending in leftovers + waiting:
            self._refuse_pending(pending, nerr.SHUTTING_DOWN, "the coordinator is shutting down.")

    @property
    def stopping(self) -> bool:
        """True after :meth:`request_stop`."""
        return self._stopping

    def _drain(self) -> list[_Pending]:
        with self._cond:
            out = list(self._inbox)
            self._inbox.clear()
            return out

    def _refuse_pending(self, pending: _Pending, reason: str, message: str) -> None:
        pending.outcome = Rejection(reason, message, self.collecting_round)
        pending.done.set()

    def all_left(self) -> bool:
        """True once every participant that joined has left."""
        with self._cond:
            return self._joined <= self._left

    def wait_all_left(self, timeout_s: float) -> bool:
        """Wait until every joined participant left, at most ``timeout_s`` seconds."""
        end = self.now() + timeout_s
        with self._cond:
            while not self._joined <= self._left and self.now() < end:
                self._cond.wait(max(0.0, end - self.now()))
            return self._joined <= self._left

    # ------------------------------------------------------------ state for the handlers
    @property
    def collecting_round(self) -> int:
        """The round being collected, or the next one to open."""
        opening = self._opening
        return opening.round_index if opening is not None else self._next_round

    def join(self, participant_id: str, hash_: str, view_json: str, version: str) -> JoinOutcome:
        """Register a participant whose config hash matches; name the differing fields if not."""
        if hash_ != self.config_hash:
            differing = self._differing(view_json)
            self.metrics.refused_calls.labels(rpc="Join", reason="config_mismatch").inc()
            logged = shown_all(differing)
            event(
                _log,
                "join_refused",
                f"refused {participant_id}: config hash {shown(hash_[:28])}... differs from "
                f"{self.config_hash[:28]}... in {', '.join(logged) or 'unknown fields'}.",
                logging.WARNING,
                participant=participant_id,
                differing=logged,
            )
            return JoinOutcome(
                False,
                f"the config hash {hash_} differs from the coordinator's {self.config_hash}; "
                "differing fields: " + (", ".join(differing) or "(the view could not be read)"),
                differing,
                self.collecting_round,
                False,
                0,
                False,
                self._final,
            )
        with self._cond:
            rejoin = participant_id in self._joined
            self._joined.add(participant_id)
            self._left.discard(participant_id)
            # Present until its presence stream opens; an open attempt it was absent from
            # still does not wait for it (it contributes from the next opening).
            self._grace_until[participant_id] = self.now() + self.grace_s
            if self._opening is not None and participant_id not in self._judged:
                self._missed.add(participant_id)
                self._absence.setdefault(participant_id, "joined_late")
            opening = self._opening
            self._cond.notify_all()
            self.metrics.seen(participant_id)
            outcome = JoinOutcome(
                True,
                f"welcome, {participant_id}.",
                [],
                self.collecting_round,
                opening is not None,
                opening.attempt if opening is not None else 0,
                opening is not None and participant_id in self._accepted,
                self._final,
            )
        self.metrics.set_joined(len(self._joined - self._left))
        if version != __version__:
            _log.warning(
                "%s runs Lensemble %s, the coordinator %s; the config hashes match, continuing.",
                participant_id,
                shown(version),
                __version__,
            )
        event(
            _log,
            "joined",
            f"{participant_id} {'re' if rejoin else ''}joined at round {outcome.collecting_round}"
            f"{' (open)' if outcome.round_open else ''}.",
            participant=participant_id,
            rejoin=rejoin,
            round=outcome.collecting_round,
        )
        return outcome

    def _differing(self, view_json: str) -> list[str]:
        """Field paths where the participant's hashed config view differs from ours."""
        try:
            theirs = json.loads(view_json)
            if not isinstance(theirs, dict):
                return []
            return differing_paths(theirs, hashed_view(self.config))
        except (ValueError, RecursionError):  # RecursionError: nested beyond Python's depth
            return []

    def leave(self, participant_id: str, reason: str) -> None:
        """Record that a participant left."""
        with self._cond:
            self._left.add(participant_id)
            if self._opening is not None and participant_id not in self._judged:
                self._missed.add(participant_id)
                self._absence.setdefault(participant_id, LEFT)
            self._cond.notify_all()
        self.metrics.seen(participant_id)
        self.metrics.set_joined(len(self._joined - self._left))
        event(_log, "left", f"{participant_id} left ({shown(reason)}).", participant=participant_id)

    def next_announcement(
        self, after: tuple[int, int], until_s: float
    ) -> tuple[RoundOpening, int] | None:
        """The next announcement for a watcher, or None at ``until_s``.

        Returns:
            ``(opening, model bytes)`` for the open round when it is newer than ``after``, or
            ``(final opening, 0)`` once the run is over.
        """
        with self._cond:
            while True:
                if self._final:
                    final = RoundOpening(self._next_round, 0, self._next_round, "", 0.0, final=True)
                    return final, 0
                opening = self._opening
                if opening is not None and (opening.round_index, opening.attempt) > after:
                    return opening, len(self._payload)
                remaining = until_s - self.now()
                if remaining <= 0 or self._stopping:
                    return None
                self._cond.wait(remaining)

    def model_payload(self, model_hash: str) -> bytes | None:
        """The open round's model payload when ``model_hash`` is its hash, else None."""
        with self._cond:
            opening = self._opening
            if opening is None or opening.model_hash != model_hash:
                return None
            return self._payload

    def count_down(self, n: int) -> None:
        """Count ``n`` model bytes streamed to a participant."""
        with self._cond:
            self._down += n
        self.metrics.bytes_out.inc(n)

    def precheck(self, header: Any) -> Rejection | Verdict | None:
        """Judge an update header before any payload byte is buffered.

        Returns:
            A rejection (``abstained`` for an attempt its sender sits out); an accepted
            ``DUPLICATE`` verdict for a resend of an update already counted in the attempt that
            just closed; or None to read the payload.
        """
        with self._cond:
            verdict = admit_attempt(
                header.participant_id,
                header.round_index,
                header.attempt,
                header.payload_hash,
                opening=self._opening,
                closed=self._closed,
                current_round=self.collecting_round,
            )
            if verdict is None:
                return self._abstained_from(
                    header.participant_id, header.round_index, header.attempt
                )
        return _as_outcome(verdict)

    def begin_upload(self, participant_id: str) -> bool:
        """Reserve the participant's single upload slot; False when one is already streaming.

        One update stream per participant at a time bounds the coordinator's buffered bytes by
        ``participants x network.max_message_bytes``.
        """
        with self._cond:
            if participant_id in self._uploading:
                return False
            self._uploading.add(participant_id)
            return True

    def end_upload(self, participant_id: str) -> None:
        """Release the slot taken by :meth:`begin_upload`."""
        with self._cond:
            self._uploading.discard(participant_id)

    def submit(
        self, submission: Submission, compute_s: float, timeout_s: float
    ) -> Verdict | Rejection:
        """Queue a complete submission for the coordinator and wait for its verdict.

        Returns:
            The coordinator's verdict, or a transport rejection when the round closed first,
            the coordinator is stopping, or no verdict came within ``timeout_s`` (``busy``).
        """
        pending = _Pending(submission, compute_s)
        with self._cond:
            if self._stopping:
                return Rejection(nerr.SHUTTING_DOWN, "the coordinator is shutting down.", -1)
            # The attempt may have closed while the update was streaming: the same rule again.
            verdict = admit_attempt(
                submission.sender,
                submission.round_index,
                submission.attempt,
                submission.payload_hash,
                opening=self._opening,
                closed=self._closed,
                current_round=self.collecting_round,
            )
            abstained = self._abstained_from(
                submission.sender, submission.round_index, submission.attempt
            )
            if abstained is not None:
                return abstained
            if verdict is None:
                self._inbox.append(pending)
                self._cond.notify_all()
        if verdict is not None:
            return _as_outcome(verdict)
        if not pending.done.wait(timeout_s) or pending.outcome is None:
            return Rejection(
                nerr.BUSY,
                f"the coordinator gave no verdict within network.rpc_timeout_s ({timeout_s} s); "
                "resend the same bytes.",
                self.collecting_round,
            )
        return pending.outcome
