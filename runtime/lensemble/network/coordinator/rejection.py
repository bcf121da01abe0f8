"""A call the coordinator refuses: its reason, its gRPC status and one sentence for the caller.

Every refusal ends its call with the gRPC status of its reason plus the trailing metadata
``lensemble-reason`` and ``lensemble-current-round``
(:mod:`lensemble.network.shared.transport_errors`), so the participant tells the causes apart
without parsing text.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from lensemble.federation.messages import Reason, Verdict
from lensemble.network.shared import transport_errors as nerr

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
    nerr.UNKNOWN_STAGE: grpc.StatusCode.INVALID_ARGUMENT,
    nerr.UNKNOWN_SESSION: grpc.StatusCode.FAILED_PRECONDITION,
    nerr.CLOSED_STAGE: grpc.StatusCode.FAILED_PRECONDITION,
    nerr.NOT_ADDRESSED: grpc.StatusCode.FAILED_PRECONDITION,
    nerr.DUPLICATE_ANSWER: grpc.StatusCode.ALREADY_EXISTS,
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


def as_outcome(verdict: Verdict) -> Verdict | Rejection:
    """An accepted verdict as it is; a refusal as a transport rejection (with its gRPC status)."""
    if verdict.accepted:
        return verdict
    return Rejection(verdict.reason.value, verdict.message, verdict.current_round)
