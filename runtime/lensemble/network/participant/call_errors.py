"""What a failed call to the coordinator means for a participant.

Failures are classified by the gRPC status and the ``lensemble-reason`` trailing metadata, not by
message text: transient ones (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``) are retried with backoff;
``stale_session`` (the coordinator restarted) triggers a new Join; a lost round is skipped;
``PERMISSION_DENIED`` stops the process (exit 3).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import grpc

from lensemble.network.shared import transport_errors as nerr
from lensemble.network.shared.peer_text import shown


class Failure(StrEnum):
    """What a failed call means for the participant."""

    TRANSIENT = "transient"
    STALE_SESSION = "stale_session"
    ROUND_LOST = "round_lost"
    REJECTED = "rejected"
    DENIED = "denied"


_TRANSIENT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.ABORTED,
    }
)


@dataclass(frozen=True)
class CallError:
    """A classified failed call.

    Attributes:
        kind: What it means for the participant.
        reason: The coordinator's reason (``lensemble-reason``), or the gRPC status name.
        message: The status details.
        current_round: The coordinator's round when it said so, else -1.
    """

    kind: Failure
    reason: str
    message: str
    current_round: int

    def __str__(self) -> str:
        # The coordinator's words: escaped and capped before they reach a log line.
        return f"{shown(self.reason)}: {shown(self.message)}"


def classify(exc: grpc.RpcError) -> CallError:
    """Turn a gRPC error into a :class:`CallError` using its status and trailing metadata."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = (exc.details() if hasattr(exc, "details") else "") or ""
    trailing = dict(exc.trailing_metadata() or ()) if hasattr(exc, "trailing_metadata") else {}
    reason = str(trailing.get(nerr.REASON_KEY, code.name.lower()))
    try:
        current = int(trailing.get(nerr.CURRENT_ROUND_KEY, -1))
    except ValueError:
        current = -1
    if reason == nerr.STALE_SESSION:
        kind = Failure.STALE_SESSION
    elif reason == nerr.TOO_MANY_CALLS:
        kind = Failure.TRANSIENT  # its own earlier calls still end on the coordinator
    elif code == grpc.StatusCode.PERMISSION_DENIED:
        kind = Failure.DENIED
    elif code == grpc.StatusCode.FAILED_PRECONDITION:
        kind = Failure.ROUND_LOST
    elif code in _TRANSIENT_CODES:
        kind = Failure.TRANSIENT
    else:
        kind = Failure.REJECTED
    return CallError(kind, reason, details, current)
