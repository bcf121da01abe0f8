"""Known-answer tests of the primitives' framing, and of what each one refuses."""

from __future__ import annotations

import hashlib
import hmac

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from lensemble.federation.secagg import primitives
from lensemble.federation.secagg.primitives import (
    BLOCK_WORDS,
    PROTOCOL,
    add_keystream,
    agree,
    derive,
    frame,
    keystream_words,
    open_sealed,
    public_bytes,
    seal,
    x25519_private,
)

# AES-256 of the zero block under the zero key (the counter-0 block of the PRG's stream).
AES256_ZERO_BLOCK = bytes.fromhex("dc95c078a2408989ad48a21492842087")
# NIST SP 800-38A, appendix F.5.5 (CTR-AES256.Encrypt), block #1.
SP800_38A_KEY = bytes.fromhex("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4")
SP800_38A_COUNTER = bytes.fromhex("f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff")
SP800_38A_PLAIN = bytes.fromhex("6bc1bee22e409f96e93d7e117393172a")
SP800_38A_CIPHER = bytes.fromhex("601ec313775789a5b7a7f504bbf3d228")
# RFC 7748, section 6.1.
ALICE_PRIVATE = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
ALICE_PUBLIC = bytes.fromhex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
BOB_PRIVATE = bytes.fromhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
BOB_PUBLIC = bytes.fromhex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
SHARED = bytes.fromhex("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")


def rfc5869_hkdf(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    """HKDF-SHA256 written out from RFC 5869 with the standard library, as an independent check."""
    prk = hmac.new(salt or bytes(32), ikm, hashlib.sha256).digest()
    out, block, counter = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes((counter,)), hashlib.sha256).digest()
        out += block
        counter += 1
    return out[:length]


def test_the_reference_hkdf_meets_rfc5869_test_case_1() -> None:
    okm = rfc5869_hkdf(b"\x0b" * 22, bytes(range(13)), bytes(range(0xF0, 0xFA)), 42)
    assert okm.hex() == (
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
    )


def test_derive_is_hkdf_sha256_salted_with_the_context_and_framed_info() -> None:
    context = hashlib.sha256(b"some session").digest()
    info = PROTOCOL + frame(b"pairwise-mask", context, b"alpine", b"delta")
    expected = rfc5869_hkdf(b"s" * 32, context, info, 32)
    assert derive(b"s" * 32, "pairwise-mask", context, "alpine", "delta") == expected


def test_derive_separates_every_label_context_and_party() -> None:
    context = bytes(32)
    keys = {
        derive(b"k" * 32, "pairwise-mask", context, "a", "b"),
        derive(b"k" * 32, "self-mask", context, "a", "b"),
        derive(b"k" * 32, "pairwise-mask", bytes(31) + b"\x01", "a", "b"),
        derive(b"k" * 32, "pairwise-mask", context, "b", "a"),
        derive(b"k" * 32, "pairwise-mask", context, "ab"),
        derive(b"k" * 32, "pairwise-mask", context, "a", "b", length=33)[:32],
    }
    # Framing makes ("a", "b") and ("ab",) different; only the length changes nothing else.
    assert len(keys) == 5


def test_the_prg_is_the_aes256_ctr_keystream_from_a_zero_counter() -> None:
    # The library's CTR mode is SP 800-38A's.
    ctr = Cipher(algorithms.AES256(SP800_38A_KEY), modes.CTR(SP800_38A_COUNTER)).encryptor()
    assert ctr.update(SP800_38A_PLAIN) == SP800_38A_CIPHER
    # Our stream: AES-256 of the big-endian counters 0, 1, 2, ... read as little-endian words.
    words = keystream_words(bytes(32), 6)
    assert words.dtype == np.dtype("<u8")
    assert words.tobytes()[:16] == AES256_ZERO_BLOCK
    ecb = Cipher(algorithms.AES256(bytes(32)), modes.ECB()).encryptor()
    counters = b"".join(i.to_bytes(16, "big") for i in range(3))
    assert words.tobytes() == ecb.update(counters)


def test_the_keystream_is_one_stream_across_blocks() -> None:
    key = hashlib.sha256(b"k").digest()
    count = 3 * BLOCK_WORDS + 5
    blocked = keystream_words(key, count)
    whole = (
        Cipher(algorithms.AES256(key), modes.CTR(bytes(16))).encryptor().update(bytes(8 * count))
    )
    assert blocked.tobytes() == whole


def test_adding_and_subtracting_a_keystream_is_exact_mod_2_64() -> None:
    vector = np.arange(1000, dtype="<u8") * np.uint64(2**61)
    before = vector.copy()
    add_keystream(vector, b"\x01" * 32, sign=+1)
    assert not np.array_equal(vector, before)
    add_keystream(vector, b"\x01" * 32, sign=-1)
    assert np.array_equal(vector, before)


def test_the_keystream_needs_a_contiguous_uint64_vector() -> None:
    with pytest.raises(ValueError, match="uint64"):
        add_keystream(np.zeros(4, dtype=np.int64), bytes(32), sign=1)
    with pytest.raises(ValueError, match="uint64"):
        add_keystream(np.zeros(8, dtype="<u8")[::2], bytes(32), sign=1)


def test_x25519_meets_rfc7748() -> None:
    alice, bob = x25519_private(ALICE_PRIVATE), x25519_private(BOB_PRIVATE)
    assert public_bytes(alice) == ALICE_PUBLIC
    assert public_bytes(bob) == BOB_PUBLIC
    assert agree(alice, BOB_PUBLIC) == SHARED == agree(bob, ALICE_PUBLIC)


def test_a_low_order_or_malformed_peer_key_gives_no_secret() -> None:
    alice = x25519_private(ALICE_PRIVATE)
    assert agree(alice, bytes(32)) is None  # the all-zero point: an all-zero shared secret
    assert agree(alice, b"short") is None


def test_aead_authenticates_the_ciphertext_and_its_context() -> None:
    key = b"\x02" * 32
    sealed = seal(key, b"share", b"context")
    assert open_sealed(key, sealed, b"context") == b"share"
    flipped = bytes([sealed[0] ^ 1]) + sealed[1:]
    assert open_sealed(key, flipped, b"context") is None
    assert open_sealed(key, sealed, b"other context") is None
    assert open_sealed(b"\x03" * 32, sealed, b"context") is None


def test_frame_is_unambiguous() -> None:
    assert frame(b"ab", b"c") != frame(b"a", b"bc")
    assert primitives.frame() == b""
