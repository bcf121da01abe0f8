"""A participant's keys for masked rounds: its own identity and seed, its peers' checked keys.

Over the network a participant signs its secure-aggregation messages with the private key of its
own mTLS certificate (``network.tls.key_file``; :mod:`lensemble.federation.secagg.identity`
accepts the P-256 keys ``lensemble certs init`` issues). Its peers' verifying keys are never
taken on the coordinator's word: the coordinator relays each peer's certificate, and
:func:`trusted_peer_keys` accepts a key only when its certificate is valid now, was issued
directly by a CA of ``network.tls.ca_file`` (its signature checked by ``cryptography``) and
names that participant (CN or SAN). A coordinator that substitutes a key therefore needs a
certificate from the participants' CA in the victim's name.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from lensemble.config import LensembleConfig
from lensemble.errors import ConfigError
from lensemble.federation.secagg import identity
from lensemble.network.shared.certs import certificate_identities
from lensemble.network.shared.key_seeds import key_secret
from lensemble.network.shared.security import load_tls

#: HKDF salt of a participant's secret seed (a version label: a new one changes every seed).
SEED_SALT = b"lensemble-secagg-seed-v1"


class PeerCertificateRefused(Exception):
    """A relayed peer certificate does not prove the key of the participant it is for.

    Attributes:
        participant: The peer the certificate was relayed for.
    """

    def __init__(self, participant: str, why: str) -> None:
        super().__init__(f"the certificate relayed for {participant} {why}")
        self.participant = participant


def own_identity(config: LensembleConfig, participant: str) -> identity.SigningKey:
    """The participant's identity key: the private key of its mTLS certificate.

    Raises:
        ConfigError: TLS is off, the key file is unreadable, or its key type cannot sign
            secure-aggregation messages (naming the field and the fix).
    """
    files = load_tls(config, participant)
    if files is None:
        raise ConfigError(
            "network.tls.enabled: masking over the network signs with each participant's "
            "TLS key; set network.tls.enabled: true and network.auth: mtls."
        )
    try:
        key = serialization.load_pem_private_key(files.key, password=None)
        identity.check_key_type(key)  # type: ignore[arg-type]
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"network.tls.key_file: the key of participant '{participant}' cannot sign "
            f"secure-aggregation keys ({exc}); issue it an EC (P-256) or Ed25519 key."
        ) from None
    return key  # type: ignore[return-value]


def secret_seed(
    key: identity.SigningKey, config: LensembleConfig, *, salt: bytes = SEED_SALT
) -> bytes:
    """The participant's 32-byte secret seed for every masked session of this run (``salt``).

    Derived with HKDF-SHA256 from the participant's own private key (its PKCS#8 DER bytes) and
    the run (its name and config hash): secret, since only the key's holder can compute it, yet
    deterministic, so a rerun (or a restarted participant) derives the same bits and a
    participant never needs to store a secret of its own. Every session secret derives from it
    and the session's digest (:mod:`lensemble.federation.secagg.keys`).
    """
    return key_secret(key, config, salt)


def trusted_authorities(config: LensembleConfig, participant: str) -> list[x509.Certificate]:
    """The CA certificates of ``network.tls.ca_file`` this participant trusts.

    Raises:
        ConfigError: TLS is off or the file holds no PEM certificate.
    """
    files = load_tls(config, participant)
    try:
        if files is None:
            raise ValueError("TLS is off")
        return x509.load_pem_x509_certificates(files.ca)
    except ValueError as exc:
        raise ConfigError(
            f"network.tls.ca_file: no CA certificate to check peers' keys against ({exc}); "
            "mount the participants' CA bundle there."
        ) from None


def peer_key(
    participant: str,
    certificate_pem: bytes,
    authorities: Sequence[x509.Certificate],
    now: dt.datetime | None = None,
) -> identity.VerifyingKey:
    """The verifying key of ``participant``, from a relayed certificate checked as described.

    Raises:
        PeerCertificateRefused: The certificate is unreadable, expired or not yet valid, not
            issued by one of ``authorities``, names someone else, or holds an unusable key.
    """
    try:
        cert = x509.load_pem_x509_certificate(certificate_pem)
    except ValueError:
        raise PeerCertificateRefused(participant, "is not a PEM certificate.") from None
    moment = now or dt.datetime.now(dt.UTC)
    if not cert.not_valid_before_utc <= moment <= cert.not_valid_after_utc:
        raise PeerCertificateRefused(participant, "is not valid now (expired or not yet valid).")
    if not any(_issued_by(cert, ca) for ca in authorities):
        raise PeerCertificateRefused(participant, "does not chain to network.tls.ca_file.")
    names = certificate_identities(certificate_pem)
    if participant not in names:
        shown = ", ".join(sorted(names))[:200]
        raise PeerCertificateRefused(participant, f"names {shown}, not {participant}.")
    key = cert.public_key()
    try:
        identity.check_key_type(key)  # type: ignore[arg-type]
    except TypeError as exc:
        raise PeerCertificateRefused(participant, f"holds an unusable key: {exc}") from None
    return key  # type: ignore[return-value]


def trusted_peer_keys(
    certificates: Mapping[str, bytes], authorities: Sequence[x509.Certificate]
) -> dict[str, identity.VerifyingKey]:
    """Every relayed peer's verifying key, each checked by :func:`peer_key`.

    Raises:
        PeerCertificateRefused: The first certificate that fails a check.
    """
    return {pid: peer_key(pid, pem, authorities) for pid, pem in sorted(certificates.items())}


def _issued_by(cert: x509.Certificate, authority: x509.Certificate) -> bool:
    """True when ``authority`` issued ``cert`` (issuer name and signature both check)."""
    try:
        cert.verify_directly_issued_by(authority)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
