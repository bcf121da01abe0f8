"""What crosses the transport seam: round openings, submissions and verdicts.

These are plain frozen dataclasses; every transport (in-process or gRPC) carries exactly these
fields. Tensors travel only inside ``payload`` bytes (safetensors), never as objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lensemble.federation.intake import Landing


@dataclass(frozen=True)
class RoundOpening:
    """The coordinator opens a round.

    Attributes:
        round_index: 0-based round ``t``; the round commits model version ``t + 1``.
        attempt: 0 for the first try, incremented when an aborted round is retried.
        model_version: Version of the global model the round starts from (equals round_index).
        model_hash: ``sha256:<hex>`` of that model (hash chain, see ``payload.model_hash``).
        deadline_s: Transport-clock time (seconds) when collection ends.
        final: True once the run is over (no round to train; participants leave).
        base_hash: ``sha256:<hex>`` of the model the round trains from when that is not
            ``model_hash``: the model the previous round announced (``federation.overlap``
            ``one_round``, :mod:`lensemble.federation.overlap`); empty for ``model_hash``.
    """

    round_index: int
    attempt: int
    model_version: int
    model_hash: str
    deadline_s: float
    final: bool = False
    base_hash: str = ""

    @property
    def trains_from(self) -> str:
        """The hash of the model the round's pseudo-gradients are computed from."""
        return self.base_hash or self.model_hash


@dataclass(frozen=True)
class Submission:
    """A participant's pseudo-gradient for one round, as received.

    Attributes:
        sender: Identity the transport authenticated (participant id from the mTLS certificate,
            the bearer token, or the in-process sender); never taken from the payload.
        round_index: Round the sender says it contributes to.
        payload: Safetensors bytes sealed by the participant's residency guard.
        payload_hash: ``sha256:<hex>`` of ``payload`` as the sender declared it.
        attempt: Attempt of that round the update was trained for (the coordinator admits
            only the open ``(round_index, attempt)``, see ``admission.admit_attempt``).
        hash_checked: True when the transport hashed ``payload`` as it arrived and found
            ``payload_hash`` (the network transport does, while streaming), so the coordinator
            does not hash the same bytes again.
        landed: The file the transport received ``payload`` into through the coordinator's
            :class:`~lensemble.federation.intake.Intake` (then ``payload`` is a read-only view
            of it), or None for bytes in memory. The coordinator keeps that file if it accepts
            the update.
    """

    sender: str
    round_index: int
    payload: bytes | memoryview
    payload_hash: str
    attempt: int
    hash_checked: bool = False
    landed: Landing | None = None


#: ``RoundRecord.excluded`` reason of a participant one of whose ranks died during the attempt
#: (:class:`lensemble.errors.RankFailure`): it sent nothing, and its group restarts next round.
RANK_FAILURE = "rank_failure"

#: ``RoundRecord.excluded`` reason of a participant that said it stopped taking part (the network
#: transport's ``Leave``; in process, a participant whose rank group exhausted its restarts).
LEFT = "left"

#: ``RoundRecord.excluded`` reason of a participant that sits an attempt out because training
#: it would spend past its own differential-privacy budget
#: (:class:`lensemble.errors.PrivacyBudgetExhausted`); it sits out every later one too (over the
#: network it says so with ``Abstain``).
PRIVACY_BUDGET = "privacy_budget"

#: ``RoundRecord.excluded`` reason of a participant that sits an overlapped attempt out because
#: it does not hold the model the attempt trains from (:class:`lensemble.errors.OverlapBaseMissing`,
#: :mod:`lensemble.federation.overlap`): it missed the previous round or restarted.
NO_BASE_MODEL = "no_base_model"

#: The closed vocabulary of reasons a participant may give for sitting out an open attempt (the
#: network transport's ``Abstain`` call; the in-process transport records the same reasons).
#: Anything else a peer sends is refused and changes nothing.
ABSTENTION_REASONS: frozenset[str] = frozenset({RANK_FAILURE, PRIVACY_BUDGET, NO_BASE_MODEL})


class Reason(StrEnum):
    """Why a submission was accepted or rejected (a Prometheus label and ledger field)."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    UNKNOWN_PARTICIPANT = "unknown_participant"
    CLOSED_ROUND = "closed_round"
    STALE_BASE = "stale_base"
    HASH_MISMATCH = "hash_mismatch"
    BAD_PAYLOAD = "bad_payload"
    ARCHITECTURE_MISMATCH = "architecture_mismatch"
    NON_FINITE = "non_finite"
    CONFLICTING_DUPLICATE = "conflicting_duplicate"
    TOO_LARGE = "too_large"
    OUT_OF_BOUNDS = "out_of_bounds"
    NORM_BOUND = "norm_bound"


@dataclass(frozen=True)
class Verdict:
    """The coordinator's answer to one submission.

    Attributes:
        reason: Accepted, duplicate (accepted once, idempotent) or a rejection reason.
        message: One sentence for the participant's log.
        current_round: The round the coordinator is collecting for.
    """

    reason: Reason
    message: str
    current_round: int

    @property
    def accepted(self) -> bool:
        """True for an accepted submission or a byte-identical duplicate of one."""
        return self.reason in (Reason.ACCEPTED, Reason.DUPLICATE)
