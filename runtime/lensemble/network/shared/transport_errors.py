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
#: A request field longer than its bound (``lensemble.network.shared.peer_text.JOIN_LIMITS``).
OVERSIZED = "oversized_field"
#: The participant already holds ``network.max_calls_per_participant`` calls (or an upload).
TOO_MANY_CALLS = "too_many_calls"
#: The call ran past its server-side deadline and was cancelled.
CALL_DEADLINE = "call_deadline"
#: An ``Abstain`` call names a reason outside ``messages.ABSTENTION_REASONS``.
UNKNOWN_ABSTENTION = "unknown_abstention"
#: An ``Abstain`` call for an attempt the participant already sent an update for.
ALREADY_SUBMITTED = "already_submitted"
#: An update for an attempt the participant said it sits out (``Abstain``).
ABSTAINED = "abstained"
#: Masked rounds (``AnswerStage``): a stage name outside the protocol's stages; an answer for a
#: session that is not being collected; for a stage of it that is not (or no longer) collected;
#: from a participant the stage sent no message; a second answer to one stage.
UNKNOWN_STAGE = "unknown_stage"
UNKNOWN_SESSION = "unknown_session"
CLOSED_STAGE = "closed_stage"
NOT_ADDRESSED = "not_addressed"
DUPLICATE_ANSWER = "duplicate_answer"


class CoordinatorUnreachable(LensembleError):
    """The coordinator could not be reached (or stopped answering) for too long."""

    code = "coordinator_unreachable"


class AccessDenied(LensembleError):
    """The coordinator refused this process's credentials or identity; fails closed."""

    code = "access_denied"
    exit_code = EXIT_FAIL_CLOSED


class ShutdownRequested(Interrupted):
    """The process received SIGTERM or SIGINT and stops gracefully."""


class CertificateRejected(LensembleError):
    """A TLS handshake failed on a certificate: permanent until someone replaces it; fails closed.

    Retrying cannot help (the same certificates fail the same way), so the participant stops at
    once with the cause instead of waiting ``join_timeout_s`` for a coordinator that does run.
    """

    code = "certificate_rejected"
    exit_code = EXIT_FAIL_CLOSED


_EXPIRED = "a certificate of the TLS handshake has expired (the coordinator's, or its CA)"
_NOT_OUR_CA = "the coordinator's certificate is not signed by network.tls.ca_file"
_WRONG_NAME = "the coordinator's certificate does not name network.host"
_REFUSED = "the coordinator refused this participant's certificate"

#: (text in a failed handshake's status details, lower case) -> the cause, in one phrase. The
#: TLS library reports these only as text; first match wins, specific before generic.
_CERTIFICATE_FAILURES: tuple[tuple[str, str], ...] = (
    ("alert_certificate_expired", f"{_REFUSED}: it has expired"),
    ("certificate has expired", _EXPIRED),
    ("certificate_expired", _EXPIRED),
    ("certificate is not yet valid", "a certificate is not valid yet (check the clocks)"),
    ("not in peer certificate", _WRONG_NAME),
    ("hostname mismatch", _WRONG_NAME),
    ("alert_unknown_ca", "the coordinator does not trust the CA of this participant"),
    ("unable to get local issuer", _NOT_OUR_CA),
    ("self signed certificate", _NOT_OUR_CA),
    ("self-signed certificate", _NOT_OUR_CA),
    ("bad_signature", _NOT_OUR_CA),  # an issuer of the same name but another key
    ("alert_bad_certificate", _REFUSED),
    ("alert_certificate_required", f"{_REFUSED}: it sent none (network.tls.client_auth)"),
    ("alert_certificate_unknown", _REFUSED),
    ("alert_certificate_revoked", f"{_REFUSED}: it is revoked"),
    ("certificate_verify_failed", f"{_NOT_OUR_CA} or is otherwise invalid"),
)


def certificate_failure(details: str) -> str | None:
    """The cause of a TLS certificate failure in a gRPC status's details, else None.

    Args:
        details: The failed call's status details (gRPC and the TLS library's text).

    Returns:
        One phrase naming what failed (no trailing period), or None when the details show no
        certificate problem (a refused connection, a timeout: transient failures).
    """
    text = details.lower()
    for marker, cause in _CERTIFICATE_FAILURES:
        if marker in text:
            return cause
    return None
