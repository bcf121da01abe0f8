"""Transport security: TLS credentials and bearer tokens of both sides.

Modes (``network.auth``):

- ``mtls``: TLS with client certificates (``network.tls.client_auth``). The caller's identity
  is its certificate's: a participant id must appear as its CN or a SAN, so a certificate issued
  to one participant can never act as another.
- ``token``: TLS, plus a per-participant bearer token in the ``authorization`` metadata. The
  coordinator reads ``id token`` lines from ``network.token_file`` (``{identity}`` becomes
  ``coordinator``) or ``LENSEMBLE_TOKEN``; a participant reads its own token the same way
  (``{identity}`` becomes its id). Tokens never appear in the config.
- ``insecure``: no authentication (the claimed id is believed); logs a warning at start-up and is
  refused in sovereign-prod by config validation.

Whatever the mode, when ``tls.client_auth`` is on the certificate must also match. Who a caller
is, from these credentials, the coordinator decides
(:class:`~lensemble.network.coordinator.authenticator.Authenticator`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from lensemble.config import LensembleConfig
from lensemble.errors import ConfigError
from lensemble.network.shared.identity import COORDINATOR_IDENTITY, identity_path

TOKEN_ENV = "LENSEMBLE_TOKEN"  # noqa: S105 (the variable's name, not a token)
MIN_TOKEN_CHARS = 16
_log = logging.getLogger("lensemble.network.security")


@dataclass(frozen=True)
class TlsFiles:
    """PEM material of one process.

    Attributes:
        cert: This process's certificate chain.
        key: Its private key.
        ca: The CA bundle that signs the peers.
    """

    cert: bytes
    key: bytes
    ca: bytes


def _read(field: str, template: str | None, identity: str) -> bytes:
    path = identity_path(template, identity)
    if path is None:
        raise ConfigError(f"network.tls.{field}: is required when TLS is on.")
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"network.tls.{field}: cannot read {path} ({exc.strerror}); create a development set "
            "with `lensemble certs init DIR --config FILE` or mount the certificate there."
        ) from None


def load_tls(config: LensembleConfig, identity: str) -> TlsFiles | None:
    """This process's TLS files, or None when TLS is off.

    Args:
        config: The run's config.
        identity: ``coordinator`` or the participant id (fills ``{identity}`` in the paths).

    Raises:
        ConfigError: A file is missing or unreadable, naming the field and the path.
    """
    tls = config.network.tls
    if not tls.enabled:
        return None
    return TlsFiles(
        cert=_read("cert_file", tls.cert_file, identity),
        key=_read("key_file", tls.key_file, identity),
        ca=_read("ca_file", tls.ca_file, identity),
    )


def server_credentials(config: LensembleConfig) -> Any:
    """The coordinator's ``grpc.ServerCredentials``, or None for a plaintext port."""
    files = load_tls(config, COORDINATOR_IDENTITY)
    if files is None:
        return None
    return grpc.ssl_server_credentials(
        [(files.key, files.cert)],
        root_certificates=files.ca,
        require_client_auth=config.network.tls.client_auth,
    )


def channel_credentials(config: LensembleConfig, participant_id: str, token: str | None) -> Any:
    """A participant's ``grpc.ChannelCredentials``, or None for a plaintext channel."""
    files = load_tls(config, participant_id)
    if files is None:
        return None
    creds = grpc.ssl_channel_credentials(
        root_certificates=files.ca,
        private_key=files.key if config.network.tls.client_auth else None,
        certificate_chain=files.cert if config.network.tls.client_auth else None,
    )
    if token is not None:
        creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
    return creds


def _token_source(config: LensembleConfig, identity: str, env: Mapping[str, str]) -> str:
    path = identity_path(config.network.token_file, identity)
    if path is not None:
        try:
            return Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"network.token_file: cannot read {path} ({exc.strerror}); write the token there "
                f"or unset network.token_file and set {TOKEN_ENV}."
            ) from None
    value = env.get(TOKEN_ENV)
    if not value:
        raise ConfigError(
            "network.auth: 'token' needs a bearer token; set network.token_file or the "
            f"{TOKEN_ENV} environment variable (tokens never go in the config)."
        )
    return value


def _check_strength(token: str, whose: str) -> None:
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise ConfigError(
            f"network.token_file: the token of {whose} must be at least {MIN_TOKEN_CHARS} "
            "characters without spaces; generate one with `python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'`."
        )


def participant_token(
    config: LensembleConfig, participant_id: str, env: Mapping[str, str] | None = None
) -> str | None:
    """The participant's bearer token (``auth: token``), else None.

    Raises:
        ConfigError: No token is configured, or it is too weak.
    """
    if config.network.auth != "token":
        return None
    token = _token_source(config, participant_id, os.environ if env is None else env).strip()
    _check_strength(token, f"participant '{participant_id}'")
    return token


def coordinator_tokens(
    config: LensembleConfig, env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Participant id -> bearer token, from ``id token`` lines (``auth: token``), else empty.

    Lines are separated by newlines or commas; blank lines and ``#`` comments are skipped.

    Raises:
        ConfigError: A line is malformed, names an unknown participant, or a token is weak.
    """
    if config.network.auth != "token":
        return {}
    text = _token_source(config, COORDINATOR_IDENTITY, os.environ if env is None else env)
    known = set(config.participant_ids)
    tokens: dict[str, str] = {}
    for number, raw in enumerate(text.replace(",", "\n").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or parts[0] not in known:
            raise ConfigError(
                f"network.token_file: entry {number} is not '<participant-id> <token>' with a "
                f"participant of this config ({', '.join(sorted(known))}); fix that line."
            )
        _check_strength(parts[1], f"participant '{parts[0]}'")
        tokens[parts[0]] = parts[1]
    missing = sorted(known - set(tokens))
    if missing:
        raise ConfigError(
            f"network.token_file: no token for {', '.join(missing)}; add an '<id> <token>' line "
            "for every participant."
        )
    return tokens


def warn_if_insecure(config: LensembleConfig) -> None:
    """Log a warning when participants are not authenticated (``auth: insecure``)."""
    if config.network.auth == "insecure":
        _log.warning(
            "network.auth is 'insecure': participants are not authenticated and any caller "
            "can submit as any participant; use mtls outside tests (sovereign-prod refuses this)."
        )
    if not config.network.tls.enabled:
        _log.warning(
            "network.tls.enabled is false: pseudo-gradients and models travel unencrypted."
        )
