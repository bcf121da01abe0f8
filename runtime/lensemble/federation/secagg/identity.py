"""Signatures with a participant's mTLS identity key, so the coordinator cannot substitute keys.

``lensemble certs init`` issues ECDSA P-256 keys (``network/shared/certs.py``); an organisation's
own PKI may issue other EC curves or Ed25519. ECDSA signs SHA-256 digests with deterministic
nonces (RFC 6979), so a rerun signs the same bytes; Ed25519 is deterministic by design. RSA and
other key types are refused with one sentence naming the fix.
"""

from __future__ import annotations

import hashlib

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

SigningKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
VerifyingKey = ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey

_ECDSA = ec.ECDSA(hashes.SHA256(), deterministic_signing=True)


def sign(key: SigningKey, message: bytes) -> bytes:
    """The signature of ``message`` (DER ECDSA or 64-byte Ed25519).

    Raises:
        TypeError: ``key`` is neither an EC nor an Ed25519 private key.
    """
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return key.sign(message, _ECDSA)
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key.sign(message)
    raise TypeError(
        f"a {type(key).__name__} identity key cannot sign secure-aggregation keys; "
        "issue the participant an EC (P-256) or Ed25519 TLS key."
    )


def verify(key: VerifyingKey, signature: bytes, message: bytes) -> bool:
    """True when ``signature`` is ``key``'s signature of ``message``."""
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, message, _ECDSA)
        elif isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(signature, message)
        else:
            return False
    except InvalidSignature:
        return False
    return True


def check_key_type(key: SigningKey | VerifyingKey) -> None:
    """Refuse a key type this module cannot sign or verify with.

    Raises:
        TypeError: Naming the type and the fix.
    """
    allowed = (
        ec.EllipticCurvePrivateKey,
        ec.EllipticCurvePublicKey,
        ed25519.Ed25519PrivateKey,
        ed25519.Ed25519PublicKey,
    )
    if not isinstance(key, allowed):
        raise TypeError(
            f"a {type(key).__name__} identity key cannot sign secure-aggregation keys; "
            "issue the participant an EC (P-256) or Ed25519 TLS key."
        )


def simulation_identity(root_seed: int, participant: str) -> ed25519.Ed25519PrivateKey:
    """A participant's identity key in a simulated run, from ``run.root_seed`` (not secret).

    In-process participants have no certificates; each gets an Ed25519 key that every party of
    the simulation derives alike, so a rerun signs the same bytes. Over the network the key is
    the participant's own mTLS key instead.
    """
    label = f"lensemble-secagg-identity-v1:{root_seed}:{participant}".encode()
    return ed25519.Ed25519PrivateKey.from_private_bytes(hashlib.sha256(label).digest())
