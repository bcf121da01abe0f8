"""Errors of the network transport, classified by cause (each maps to a process exit code).

A gRPC status crossing the wire loses its Python type, so the reason travels explicitly in the
trailing metadata ``lensemble-reason`` and is turned back into one of these classes on the
participant side; nothing depends on message text.
"""

from __future__ import annotations

from lensemble.errors import EXIT_FAIL_CLOSED, Interrupted, LensembleError

#: Trailing metadata key carrying the rejection reason (a ``Reason`` value or one below).
REASON_KEY = "lensemble-reason"
#: Trailing metadata key carrying the round the coordinator is collecting.
CURRENT_ROUND_KEY = "lensemble-current-round"

#: Transport-level rejection reasons, next to ``lensemble.federation.messages.Reason``.
BAD_CREDENTIALS = "bad_credentials"
STALE_SESSION = "stale_session"
SHUTTING_DOWN = "shutting_down"
BUSY = "busy"
#: The participant already holds ``network.max_calls_per_participant`` calls (or an upload).
TOO_MANY_CALLS = "too_many_calls"
#: The call ran past its server-side deadline and was cancelled.
CALL_DEADLINE = "call_deadline"


class CoordinatorUnreachable(LensembleError):
    """The coordinator could not be reached (or stopped answering) for too long."""

    code = "coordinator_unreachable"


class AccessDenied(LensembleError):
    """The coordinator refused this process's credentials or identity; fails closed."""

    code = "access_denied"
    exit_code = EXIT_FAIL_CLOSED


class ShutdownRequested(Interrupted):
    """The process received SIGTERM or SIGINT and stops gracefully."""
