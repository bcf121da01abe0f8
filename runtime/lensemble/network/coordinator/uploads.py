"""Update streams in flight, uploads refused for good, and abstentions.

One update stream per participant at a time (:meth:`Uploads.begin_upload`) bounds the
coordinator's buffered bytes by ``participants x network.max_message_bytes``. An upload the
transport refuses for good (too large, malformed, a hash mismatch) ends the open attempt's wait
for its sender, with the refusal as its ledger reason (:meth:`Uploads.upload_refused`). A
participant that sits the open attempt out says so with ``Abstain`` (:meth:`Uploads.abstain`:
a reason of ``ABSTENTION_REASONS``, recorded as the in-process transport records it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from lensemble.federation.messages import ABSTENTION_REASONS, Reason
from lensemble.network.coordinator.attempt_board import AttemptBoard
from lensemble.network.coordinator.hand_over import HandOver
from lensemble.network.coordinator.rejection import Rejection
from lensemble.network.shared import transport_errors as nerr
from lensemble.network.shared.logs import event
from lensemble.network.shared.peer_text import shown

_log = logging.getLogger("lensemble.network.coordinator")


@dataclass(frozen=True)
class Abstention:
    """An abstention the transport took (see ``AbstainReply`` in the proto).

    Attributes:
        duplicate: A repeat of an abstention already recorded (changes nothing).
        current_round: The round the coordinator is collecting, or the next one.
    """

    duplicate: bool
    current_round: int


class Uploads:
    """Upload slots, uploads refused for good, and abstentions from the open attempt.

    Args:
        board: The transport's shared round state (and its lock).
        hand_over: Tells whether a participant's update is queued or being judged.
    """

    def __init__(self, board: AttemptBoard, hand_over: HandOver) -> None:
        self._board = board
        self._hand_over = hand_over
        self._uploading: set[str] = set()

    def begin_upload(self, participant_id: str) -> bool:
        """Reserve the participant's single upload slot; False when one is already streaming."""
        with self._board.cond:
            if participant_id in self._uploading:
                return False
            self._uploading.add(participant_id)
            return True

    def end_upload(self, participant_id: str) -> None:
        """Release the slot taken by :meth:`begin_upload`."""
        with self._board.cond:
            self._uploading.discard(participant_id)

    def upload_refused(self, participant: str, round_index: int, attempt: int, reason: str) -> None:
        """The transport refused an upload of ``participant`` for good (it will not resend).

        The open attempt no longer waits for it, and its ledger entry can name ``reason``.
        """
        board = self._board
        with board.cond:
            if not board.is_open(round_index, attempt):
                return
            if participant in board.abstained:
                return  # it sits the attempt out: its stated reason stands
            if participant in board.expected and participant not in board.accepted:
                board.judged.add(participant)
                board.absence[participant] = reason
                board.cond.notify_all()

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
        board = self._board
        if reason not in ABSTENTION_REASONS:
            return Rejection(
                nerr.UNKNOWN_ABSTENTION,
                f"abstention reason {shown(reason[:64])!r} is not one of "
                f"{', '.join(sorted(ABSTENTION_REASONS))}; send one of those.",
                board.collecting_round,
            )
        with board.cond:
            current = board.collecting_round
            answer = self._judge_abstention(participant, round_index, attempt, reason)
            if answer is not None:
                return answer
            board.abstained[participant] = reason
            board.judged.add(participant)
            board.absence[participant] = reason
            board.cond.notify_all()
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

    def _judge_abstention(
        self, participant: str, round_index: int, attempt: int, reason: str
    ) -> Abstention | Rejection | None:
        """A known-reason abstention's answer when it changes nothing, else None to record it.

        The caller holds the lock.
        """
        board = self._board
        current = board.collecting_round
        if participant not in board.expected:
            return Rejection(
                Reason.UNKNOWN_PARTICIPANT.value,
                f"'{shown(participant[:64])}' is not a participant of this run.",
                current,
            )
        if not board.is_open(round_index, attempt):
            closed = board.closed
            if (
                closed is not None
                and (round_index, attempt) == (closed.round_index, closed.attempt)
                and board.closed_abstained.get(participant) == reason
            ):
                return Abstention(True, current)
            opening = board.opening
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
        earlier = board.abstained.get(participant)
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
        return None

    def _sent_update(self, participant: str) -> bool:
        """True when ``participant`` sent an update for the open attempt (caller holds the lock).

        Judged (accepted, rejected, or refused by the transport), queued, being judged, or still
        streaming.
        """
        if participant in self._board.judged or participant in self._uploading:
            return True
        return self._hand_over.sends(participant)
