"""The cryptographic primitives, all from the ``cryptography`` library, each domain-separated.

- Key derivation: HKDF-SHA256 (RFC 5869). :func:`derive` takes a label and the session's
  context digest (which binds run, round, attempt, group, roster and parameters) plus the
  parties (ids), so no two uses in any session ever share a key.
- Key agreement: X25519 (RFC 7748); an all-zero shared secret (a low-order peer key) is refused.
- Pseudo-random generator: the AES-256 keystream in counter mode (NIST SP 800-38A, section
  6.5; the initial counter block is zero) under a derived 32-byte key, read as little-endian
  uint64 words and added to (or subtracted from) a vector in place, in blocks of
  :data:`BLOCK_WORDS`, so memory stays at one block beyond the vector. AES rather than ChaCha20
  because the pairwise masks are most of a participant's work and the AES instructions of
  current server CPUs make its keystream about 1.5 x as fast (docs/performance.md).
- Authenticated encryption: ChaCha20-Poly1305 (RFC 8439). Every key encrypts exactly one
  message (it is derived per session, sender and receiver), so the all-zero nonce is safe.

Nothing here is a cipher or a PRG of our own: only the framing of the library's.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

#: Prefix of every HKDF ``info``, signed message and commitment of this protocol.
#: v2: the PRG is AES-256-CTR (v1 used ChaCha20), so a v1 peer's signatures and keys fail here
#: by name instead of its masks failing to cancel.
PROTOCOL = b"lensemble-secagg-v2"
KEY_BYTES = 32
#: Words of keystream per call into OpenSSL (512 KiB; measured in bench/secagg.py).
BLOCK_WORDS = 1 << 16
_ZERO_COUNTER = bytes(16)
_ZERO_NONCE_12 = bytes(12)
_LEN = struct.Struct(">I")


def frame(*parts: bytes) -> bytes:
    """Parts joined unambiguously: each preceded by its 4-byte big-endian length."""
    return b"".join(_LEN.pack(len(p)) + p for p in parts)


def derive(secret: bytes, label: str, context: bytes, *parties: str, length: int = 32) -> bytes:
    """A key for one use: HKDF-SHA256 of ``secret``, salted with the context digest.

    ``info`` is ``PROTOCOL || frame(label, context, party...)``.

    Args:
        secret: Input keying material (a seed, a shared secret), at least 32 bytes.
        label: The use, e.g. ``"pairwise-mask"``.
        context: The session's 32-byte context digest.
        parties: Participant ids the key belongs to, in a fixed order.
        length: Output bytes (at most 8160).

    Returns:
        ``length`` bytes.
    """
    info = PROTOCOL + frame(label.encode(), context, *(p.encode() for p in parties))
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=context, info=info).derive(secret)


def x25519_private(seed: bytes) -> X25519PrivateKey:
    """The X25519 private key whose 32 bytes are ``seed`` (clamped by X25519 itself)."""
    return X25519PrivateKey.from_private_bytes(seed)


def public_bytes(key: X25519PrivateKey) -> bytes:
    """The 32-byte raw public key of ``key``."""
    return key.public_key().public_bytes_raw()


def agree(private: X25519PrivateKey, peer_public: bytes) -> bytes | None:
    """The X25519 shared secret with ``peer_public``, or None for a key that yields none.

    A malformed public key, or one of low order whose shared secret is all zeros, gives None
    (the caller refuses it, naming the peer).
    """
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError:
        return None


def keystream_words(key: bytes, count: int) -> np.ndarray:
    """The first ``count`` uint64 words (little-endian) of the AES-256-CTR keystream of ``key``.

    The counter block starts at zero (every key is used for one stream only), so the stream is
    AES-256 of the 128-bit big-endian counters 0, 1, 2, ...
    """
    out = np.zeros(count, dtype="<u8")
    add_keystream(out, key, sign=+1)
    return out


def add_keystream(vector: np.ndarray, key: bytes, *, sign: int) -> None:
    """Add (``sign=+1``) or subtract (``-1``) the keystream of ``key`` to ``vector``, mod 2**64.

    Args:
        vector: A C-contiguous little-endian uint64 vector, changed in place.
        key: A 32-byte derived key.
        sign: +1 or -1.

    Raises:
        ValueError: ``vector`` is not a C-contiguous little-endian uint64 array.
    """
    add_keystreams(vector, [(key, sign)])


def add_keystreams(vector: np.ndarray, streams: Sequence[tuple[bytes, int]]) -> None:
    """Add or subtract the keystream of every ``(key, sign)`` in ``streams`` to ``vector``.

    The same result as :func:`add_keystream` once per stream, in one pass over ``vector``: each
    block of it takes every stream's next block while it is in cache, so the additions cost
    about a memory pass in all instead of one per stream (most of a participant's masking is
    these n keystreams; docs/performance.md).

    Args:
        vector: A C-contiguous little-endian uint64 vector, changed in place.
        streams: ``(32-byte derived key, +1 or -1)`` pairs.

    Raises:
        ValueError: ``vector`` is not a C-contiguous little-endian uint64 array.
    """
    if vector.dtype != np.dtype("<u8") or not vector.flags.c_contiguous:
        raise ValueError("the vector must be a C-contiguous little-endian uint64 array")
    encryptors = [
        (
            Cipher(algorithms.AES256(key), modes.CTR(_ZERO_COUNTER)).encryptor(),
            np.add if sign > 0 else np.subtract,
        )
        for key, sign in streams
    ]
    size = min(BLOCK_WORDS, len(vector))
    zeros = np.zeros(size, dtype="<u8")
    block = np.empty(size, dtype="<u8")
    for start in range(0, len(vector), size):
        part = vector[start : start + size]
        words = len(part)
        source, target = zeros[:words].data.cast("B"), block[:words]
        for encryptor, combine in encryptors:
            encryptor.update_into(source, target.data.cast("B"))
            combine(part, target, out=part)


def seal(key: bytes, plaintext: bytes, associated: bytes) -> bytes:
    """ChaCha20-Poly1305 encryption under a single-use key: ciphertext then 16-byte tag."""
    return ChaCha20Poly1305(key).encrypt(_ZERO_NONCE_12, plaintext, associated)


def open_sealed(key: bytes, ciphertext: bytes, associated: bytes) -> bytes | None:
    """The plaintext of :func:`seal`, or None when the ciphertext or its context was altered."""
    try:
        return ChaCha20Poly1305(key).decrypt(_ZERO_NONCE_12, ciphertext, associated)
    except InvalidTag:
        return None
