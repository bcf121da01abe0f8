"""Who a caller of the coordinator really is: the participant it claims, checked.

The participant id a call claims is believed only when its credentials say so (``network.auth``,
see :mod:`lensemble.network.shared.security`): with ``mtls`` (or any mode with
``network.tls.client_auth``) the verified client certificate must name it as its CN or a SAN, so
a certificate issued to one participant can never act as another; with ``token`` the bearer
token must be that participant's. The gRPC port (:mod:`lensemble.network.coordinator.call_guard`)
and the model download port (:mod:`lensemble.network.coordinator.download_server`) ask the same
:class:`Authenticator`.
"""

from __future__ import annotations

import hmac
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from lensemble.config import LensembleConfig
from lensemble.network.shared.transport_errors import BAD_CREDENTIALS


@dataclass(frozen=True)
class Refusal:
    """Why a caller may not act as the participant it claims to be.

    Attributes:
        reason: ``unknown_participant`` or ``bad_credentials`` (a metrics label).
        message: One sentence for the caller.
    """

    reason: str
    message: str


class Authenticator:
    """Decides whether a gRPC caller may act as a participant.

    Args:
        config: The run's config (``network.auth``, ``network.tls.client_auth``).
        participants: The run's participant ids.
        tokens: Participant id -> bearer token (``auth: token``).
    """

    def __init__(
        self,
        config: LensembleConfig,
        participants: Collection[str],
        tokens: Mapping[str, str] | None = None,
    ) -> None:
        self.mode = config.network.auth
        self.client_certs = config.network.tls.enabled and config.network.tls.client_auth
        self.participants = frozenset(participants)
        self.tokens = dict(tokens or {})

    @staticmethod
    def certificate_names(auth_context: Mapping[str, Collection[bytes]]) -> set[str]:
        """CN and SANs of the verified client certificate in a gRPC auth context."""
        names: set[str] = set()
        for key in ("x509_common_name", "x509_subject_alternative_name"):
            names.update(v.decode(errors="replace") for v in auth_context.get(key, ()))
        return names

    def check(
        self,
        claimed: str,
        auth_context: Mapping[str, Collection[bytes]],
        metadata: Mapping[str, str],
        *,
        certificate: bool = True,
    ) -> Refusal | None:
        """None when the caller may act as ``claimed``, else why not.

        Args:
            claimed: The participant id the call claims.
            auth_context: ``context.auth_context()`` of the call.
            metadata: The call's invocation metadata (lower-case keys).
            certificate: False skips the client-certificate check (the metadata-only check that
                runs before a call gets a handler thread; the full check follows in it).
        """
        if claimed not in self.participants:
            shown = repr(claimed[:64]) if claimed else "no participant id"
            return Refusal("unknown_participant", f"{shown} is not a participant of this run.")
        if self.client_certs and certificate:
            names = self.certificate_names(auth_context)
            if claimed not in names:
                shown = ", ".join(sorted(names)) or "no verified certificate"
                return Refusal(
                    BAD_CREDENTIALS,
                    f"the client certificate ({shown}) does not identify participant '{claimed}'.",
                )
        if self.mode == "token":
            offered = metadata.get("authorization", "")
            expected = self.tokens.get(claimed, "")
            good = offered.startswith("Bearer ") and bool(expected)
            if not (good and hmac.compare_digest(offered[7:].encode(), expected.encode())):
                return Refusal(
                    BAD_CREDENTIALS,
                    f"the bearer token is not the token of participant '{claimed}'.",
                )
        return None
