"""Why a secure-aggregation message was refused or a session aborted, by a stable reason.

A :class:`SecAggRefusal` refuses one message: the participant session that raises it stops for
good (it reveals nothing more); the coordinator's session leaves the sender out, as a dropout.
A :class:`SecAggAbort` ends the coordinator's session: the round cannot commit. Both carry a
:class:`Reason` (callers branch on it, never on message text), the stage and, where one is to
blame or to name, the participant.
"""

from __future__ import annotations

from enum import StrEnum

from lensemble.errors import EXIT_FAIL_CLOSED, EXIT_RUN_FAILED, LensembleError


class Reason(StrEnum):
    """Every classified reason a message is refused or a session aborts."""

    BAD_MESSAGE = "bad_message"
    WRONG_SESSION = "wrong_session"
    OUT_OF_ORDER = "out_of_order"
    UNKNOWN_PARTICIPANT = "unknown_participant"
    DUPLICATE_MESSAGE = "duplicate_message"
    KEY_SIGNATURE_INVALID = "key_signature_invalid"
    DUPLICATE_KEY = "duplicate_key"
    SHARE_TAMPERED = "share_tampered"
    WRONG_RECIPIENTS = "wrong_recipients"
    WRONG_DIMENSION = "wrong_dimension"
    NON_FINITE_UPDATE = "non_finite_update"
    SURVIVOR_SET_INCONSISTENT = "survivor_set_inconsistent"
    DOUBLE_REVEAL = "double_reveal"
    BELOW_THRESHOLD = "below_threshold"
    RECONSTRUCTION_FAILED = "reconstruction_failed"
    UNMASK_CHECK_FAILED = "unmask_check_failed"
    SESSION_CLOSED = "session_closed"
    PRESENT_SET_REFUSED = "present_set_refused"
    UNSIGNED_SURVIVOR = "unsigned_survivor"
    ROUND_ALREADY_SIGNED = "round_already_signed"
    BELOW_QUORUM = "below_quorum"


class SecAggRefusal(LensembleError):
    """One protocol message was refused; fails closed.

    Attributes:
        reason: Why, as a stable :class:`Reason`.
        participant: The participant named by the refusal (the sender of the refused message,
            or the peer whose key, share or signature is at fault), or None.
        stage: The protocol stage (``advertise``, ``share``, ``mask``, ``consistency``,
            ``unmask``).
    """

    code = "secagg_refused"
    exit_code = EXIT_FAIL_CLOSED

    def __init__(
        self,
        reason: Reason,
        message: str,
        *,
        stage: str,
        participant: str | None = None,
        remediation: str = "",
    ) -> None:
        super().__init__(f"secure aggregation ({stage}): {message}", remediation=remediation)
        self.reason = reason
        self.participant = participant
        self.stage = stage


class SecAggAbort(LensembleError):
    """The coordinator's session cannot produce a sum; the round does not commit.

    Attributes:
        reason: Why, as a stable :class:`Reason`.
        stage: The protocol stage at which it aborted.
        participants: Participants the abort names (e.g. the owner of a secret no subset of
            shares reconstructs), sorted.
    """

    code = "secagg_aborted"
    exit_code = EXIT_RUN_FAILED

    def __init__(
        self,
        reason: Reason,
        message: str,
        *,
        stage: str,
        participants: tuple[str, ...] = (),
        remediation: str = "",
    ) -> None:
        super().__init__(f"secure aggregation ({stage}): {message}", remediation=remediation)
        self.reason = reason
        self.stage = stage
        self.participants = participants
