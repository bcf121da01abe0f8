"""Every secret and key of the protocol, derived with its own label (domain separation).

A participant's per-session secrets come from one 32-byte seed it holds: its two X25519 private
keys (c_u for share encryption, s_u for masking), its self-mask seed b_u and the randomness of
its Shamir polynomials, each ``HKDF(seed, label, context digest, participant)``. The same seed
and session give the same bits, so a simulated run reruns identically; a real participant draws
its seed fresh from the operating system for each session (phase 2). Keys between two parties
add both ids (sorted for the symmetric pairwise mask key, sender then receiver for the
single-use share encryption key).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from lensemble.federation.secagg.primitives import (
    PROTOCOL,
    agree,
    derive,
    frame,
    keystream_words,
    x25519_private,
)
from lensemble.federation.secagg.shamir import COEFFICIENT_BYTES, coefficients_from

SEED_BYTES = 32


@dataclass(frozen=True)
class ParticipantSecrets:
    """One participant's secrets for one session.

    Attributes:
        encryption_key: c_u^SK, X25519.
        masking_key: s_u^SK, X25519.
        self_mask_seed: b_u, 32 bytes.
        polynomial_key: 32-byte key of the keystream the Shamir coefficients come from.
    """

    encryption_key: X25519PrivateKey
    masking_key: X25519PrivateKey
    self_mask_seed: bytes
    polynomial_key: bytes

    @classmethod
    def derive(cls, seed: bytes, context: bytes, participant: str) -> ParticipantSecrets:
        """The secrets of ``participant`` in the session whose digest is ``context``.

        Raises:
            ValueError: ``seed`` is not 32 bytes.
        """
        if len(seed) != SEED_BYTES:
            raise ValueError(f"a participant's secure-aggregation seed has {SEED_BYTES} bytes")
        return cls(
            encryption_key=x25519_private(derive(seed, "encryption-key", context, participant)),
            masking_key=x25519_private(derive(seed, "masking-key", context, participant)),
            self_mask_seed=derive(seed, "self-mask-seed", context, participant),
            polynomial_key=derive(seed, "shamir-polynomials", context, participant),
        )

    def coefficients(self, threshold: int) -> tuple[list[int], list[int]]:
        """The ``threshold - 1`` coefficients of the b_u and of the s_u^SK polynomials."""
        count = threshold - 1
        words = (2 * count * COEFFICIENT_BYTES + 7) // 8
        stream = keystream_words(self.polynomial_key, words).tobytes()
        half = count * COEFFICIENT_BYTES
        return coefficients_from(stream[:half], count), coefficients_from(
            stream[half : 2 * half], count
        )


def commitment(self_mask_seed: bytes, context: bytes, owner: str) -> bytes:
    """SHA-256 commitment to b_u, published in the signed advertisement."""
    material = PROTOCOL + frame(b"self-mask-commitment", context, owner.encode(), self_mask_seed)
    return hashlib.sha256(material).digest()


def self_mask_key(self_mask_seed: bytes, context: bytes, owner: str) -> bytes:
    """The keystream key of PRG(b_u)."""
    return derive(self_mask_seed, "self-mask", context, owner)


def pairwise_mask_key(shared: bytes, context: bytes, a: str, b: str) -> bytes:
    """The keystream key of PRG(s_uv), the same for both parties (ids sorted)."""
    low, high = sorted((a, b))
    return derive(shared, "pairwise-mask", context, low, high)


def share_encryption_key(shared: bytes, context: bytes, sender: str, receiver: str) -> bytes:
    """The single-use AEAD key of ``sender``'s shares for ``receiver``."""
    return derive(shared, "share-encryption", context, sender, receiver)


def share_associated_data(context: bytes, sender: str, receiver: str) -> bytes:
    """What the share ciphertext authenticates besides its plaintext."""
    return PROTOCOL + frame(b"share", context, sender.encode(), receiver.encode())


def mask_sign(owner: str, peer: str) -> int:
    """+1 when ``owner`` adds PRG(s_uv) (it sorts first), -1 when it subtracts it."""
    return 1 if owner < peer else -1


def pairwise_key(
    private: X25519PrivateKey, peer_public: bytes, context: bytes, owner: str, peer: str
) -> bytes | None:
    """The pairwise mask key of ``owner`` and ``peer``, or None for an unusable peer key."""
    shared = agree(private, peer_public)
    return None if shared is None else pairwise_mask_key(shared, context, owner, peer)


def simulation_seed(root_seed: int, participant: str) -> bytes:
    """A participant's seed in a simulated run, from ``run.root_seed`` (not secret)."""
    return hashlib.sha256(f"lensemble-secagg-seed-v1:{root_seed}:{participant}".encode()).digest()
