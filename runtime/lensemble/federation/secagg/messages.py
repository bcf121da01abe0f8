"""The protocol's messages: typed, immutable, each with a bounded, canonical byte encoding.

Participant to coordinator: :class:`KeyAdvert` (AdvertiseKeys), :class:`EncryptedShares`
(ShareKeys), :class:`MaskedInput` (MaskedInputCollection), :class:`ConsistencySignature`
(ConsistencyCheck), :class:`UnmaskShares` (Unmasking). Coordinator to participants:
:class:`KeyRoster`, :class:`ShareDelivery`, :class:`SurvivorSet`, :class:`UnmaskRequest`.
Every message starts with the session's context digest. Lists are sorted by participant id with
no duplicates, so each message has exactly one encoding; decoding refuses anything else
(:mod:`~lensemble.federation.secagg.wire` gives the framing and bounds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from lensemble.federation.secagg.primitives import PROTOCOL, frame
from lensemble.federation.secagg.shamir import SHARE_BYTES
from lensemble.federation.secagg.wire import MAX_SIGNATURE_BYTES, Reader, Writer

DIGEST_BYTES = 32
PUBLIC_KEY_BYTES = 32
#: Plaintext of one encrypted share pair: a self-mask-seed share and a masking-key share.
SHARE_PLAINTEXT_BYTES = 2 * SHARE_BYTES
#: Ciphertext of one share pair: the plaintext and a 16-byte Poly1305 tag.
SHARE_CIPHERTEXT_BYTES = SHARE_PLAINTEXT_BYTES + 16
#: Most uint64 words of a masked vector (d + 2 with d at most 2**34).
MAX_WORDS = 2**34 + 2


def _ids(reader: Reader, field: str) -> tuple[str, ...]:
    ids = tuple(reader.text(field) for _ in range(reader.count(field)))
    if list(ids) != sorted(set(ids)):
        raise reader.refuse(f"{field} is not sorted without duplicates")
    return ids


def _put_ids(out: Writer, ids: tuple[str, ...]) -> None:
    out.u32(len(ids))
    for participant in ids:
        out.text(participant)


def _pairs(
    reader: Reader, field: str, *, maximum: int, exact: int | None = None
) -> tuple[tuple[str, bytes], ...]:
    pairs = tuple(
        (reader.text(field), reader.blob(field, maximum=maximum, exact=exact))
        for _ in range(reader.count(field))
    )
    names = [name for name, _ in pairs]
    if names != sorted(set(names)):
        raise reader.refuse(f"{field} is not sorted by participant without duplicates")
    return pairs


def _put_pairs(out: Writer, pairs: tuple[tuple[str, bytes], ...]) -> None:
    out.u32(len(pairs))
    for name, blob in pairs:
        out.text(name).blob(blob)


@dataclass(frozen=True)
class KeyAdvert:
    """AdvertiseKeys: a participant's two X25519 public keys, signed with its identity key.

    Attributes:
        context: The session's context digest.
        sender: The participant.
        encryption_key: X25519 public key c_u^PK (shares are encrypted under its agreements).
        masking_key: X25519 public key s_u^PK (pairwise masks come from its agreements).
        commitment: SHA-256 commitment to the self-mask seed b_u (checks its reconstruction).
        signature: The identity key's signature of :meth:`signed_bytes`.
    """

    KIND: ClassVar[int] = 1
    context: bytes
    sender: str
    encryption_key: bytes
    masking_key: bytes
    commitment: bytes
    signature: bytes

    def signed_bytes(self) -> bytes:
        """What the signature covers: the protocol, context, sender, both keys, commitment."""
        return PROTOCOL + frame(
            b"advertise",
            self.context,
            self.sender.encode(),
            self.encryption_key,
            self.masking_key,
            self.commitment,
        )

    def write(self, out: Writer) -> Writer:
        """Append the fields to ``out``."""
        return (
            out.blob(self.context)
            .text(self.sender)
            .blob(self.encryption_key)
            .blob(self.masking_key)
            .blob(self.commitment)
            .blob(self.signature)
        )

    def encode(self) -> bytes:
        """The message's bytes."""
        return self.write(Writer(self.KIND)).finish()

    @classmethod
    def read(cls, reader: Reader) -> KeyAdvert:
        """The fields, in order, from ``reader``."""
        return cls(
            context=reader.blob("context", maximum=DIGEST_BYTES, exact=DIGEST_BYTES),
            sender=reader.text("sender"),
            encryption_key=reader.blob("encryption key", maximum=32, exact=PUBLIC_KEY_BYTES),
            masking_key=reader.blob("masking key", maximum=32, exact=PUBLIC_KEY_BYTES),
            commitment=reader.blob("commitment", maximum=32, exact=DIGEST_BYTES),
            signature=reader.blob("signature", maximum=MAX_SIGNATURE_BYTES),
        )

    @classmethod
    def decode(cls, data: bytes | memoryview) -> KeyAdvert:
        """Parse; every error a ``bad_message`` refusal."""
        reader = Reader(data, cls.KIND, what="key advertisement", stage="advertise")
        message = cls.read(reader)
        reader.done()
        return message


@dataclass(frozen=True)
class KeyRoster:
    """The coordinator's broadcast of every advertisement it accepted (U1), sorted by sender."""

    KIND: ClassVar[int] = 2
    context: bytes
    adverts: tuple[KeyAdvert, ...]

    def encode(self) -> bytes:
        """The message's bytes."""
        out = Writer(self.KIND).blob(self.context).u32(len(self.adverts))
        for advert in self.adverts:
            advert.write(out)
        return out.finish()

    @classmethod
    def decode(cls, data: bytes | memoryview) -> KeyRoster:
        """Parse; every error a ``bad_message`` refusal."""
        reader = Reader(data, cls.KIND, what="key roster", stage="share")
        context = reader.blob("context", maximum=DIGEST_BYTES, exact=DIGEST_BYTES)
        adverts = tuple(KeyAdvert.read(reader) for _ in range(reader.count("adverts")))
        reader.done()
        senders = [a.sender for a in adverts]
        if senders != sorted(set(senders)):
            raise reader.refuse("adverts are not sorted by sender without duplicates")
        return cls(context, adverts)


@dataclass(frozen=True)
class EncryptedShares:
    """ShareKeys: a participant's encrypted share pairs, one per other participant of U1.

    Attributes:
        context: The session's context digest.
        sender: The participant whose secrets are shared.
        ciphertexts: ``(receiver, AEAD ciphertext)`` sorted by receiver.
    """

    KIND: ClassVar[int] = 3
    context: bytes
    sender: str
    ciphertexts: tuple[tuple[str, bytes], ...]

    def encode(self) -> bytes:
        """The message's bytes."""
        out = Writer(self.KIND).blob(self.context).text(self.sender)
        _put_pairs(out, self.ciphertexts)
        return out.finish()

    @classmethod
    def decode(cls, data: bytes | memoryview) -> EncryptedShares:
        """Parse; every error a ``bad_message`` refusal."""
        reader = Reader(data, cls.KIND, what="encrypted shares", stage="share")
        context = reader.blob("context", maximum=DIGEST_BYTES, exact=DIGEST_BYTES)
        sender = reader.text("sender")
        pairs = _pairs(
            reader, "ciphertexts", maximum=SHARE_CIPHERTEXT_BYTES, exact=SHARE_CIPHERTEXT_BYTES
        )
        reader.done()
        return cls(context, sender, pairs)


@dataclass(frozen=True)
class ShareDelivery:
    """The ciphertexts addressed to one participant, from every other member of U2.

    Attributes:
        context: The session's context digest.
        receiver: The participant they are for.
        ciphertexts: ``(sender, AEAD ciphertext)`` sorted by sender.
    """

    KIND: ClassVar[int] = 4
    context: bytes
    receiver: str
    ciphertexts: tuple[tuple[str, bytes], ...]

    def encode(self) -> bytes:
        """The message's bytes."""
        out = Writer(self.KIND).blob(self.context).text(self.receiver)
        _put_pairs(out, self.ciphertexts)
        return out.finish()

    @classmethod
    def decode(cls, data: bytes | memoryview) -> ShareDelivery:
        """Parse; every error a ``bad_message`` refusal."""
        reader = Reader(data, cls.KIND, what="share delivery", stage="mask")
        context = reader.blob("context", maximum=DIGEST_BYTES, exact=DIGEST_BYTES)
        receiver = reader.text("receiver")
        pairs = _pairs(
            reader, "ciphertexts", maximum=SHARE_CIPHERTEXT_BYTES, exact=SHARE_CIPHERTEXT_BYTES
        )
        reader.done()
        return cls(context, receiver, pairs)


@dataclass(frozen=True)
class MaskedInput:
    """MaskedInputCollection: one participant's masked vector, d + 2 uint64 words.

    Attributes:
        context: The session's context digest.
        sender: The participant.
        vector: Little-endian uint64 words: masked values, masked clipped count, masked 1.
            Decoded, it is a read-only view into the message bytes (no copy).
    """

    KIND: ClassVar[int] = 5
    context: bytes
    sender: str
    vector: np.ndarray

    def encode(self) -> bytes:
        """The message's bytes."""
        words = np.ascontiguousarray(self.vector, dtype="<u8")
        return Writer(self.KIND).blob(self.context).text(self.sender).blob(words.data).finish()

    @classmethod
    def decode(cls, data: bytes | memoryview) -> MaskedInput:
        """Parse; every error a ``bad_message`` refusal."""
        reader = Reader(data, cls.KIND, what="masked input", stage="mask")
        context = reader.blob("context", maximum=DIGEST_BYTES, exact=DIGEST_BYTES)
        sender = reader.text("sender")
        raw = reader.blob_view("vector", maximum=8 * MAX_WORDS)
        reader.done()
        if len(raw) % 8:
            raise reader.refuse(f"its vector has {len(raw)} bytes, not a whole number of words")
        return cls(context, sender, np.frombuffer(raw, dtype="<u8"))


@dataclass(frozen=True)
class SurvivorSet:
    """The coordinator's U3: the participants whose masked inputs are in the sum, sorted."""

    KIND: ClassVar[int] = 6
    context: bytes
    survivors: tuple[str, ...]

    def encode(self) -> bytes:
        """The message's bytes."""
        out = Writer(self.KIND).blob(self.context)
        _put_ids(out, self.survivors)
        return out.finish()

    @classmethod
    def decode(cls, data: bytes | memoryview) -> SurvivorSet:
        """Parse; every error a ``bad_message`` refusal."""
        reader = Reader(data, cls.KIND, what="survivor set", stage="consistency")
        context = reader.blob("context", maximum=DIGEST_BYTES, exact=DIGEST_BYTES)
        survivors = _ids(reader, "survivors")
        reader.done()
        return cls(context, survivors)


def consistency_bytes(context: bytes, signer: str, survivors: tuple[str, ...]) -> bytes:
    """What a ConsistencyCheck signature covers: the context, the signer and U3."""
    return PROTOCOL + frame(
        b"consistency", context, signer.encode(), *(s.encode() for s in survivors)
    )


@dataclass(frozen=True)
class ConsistencySignature:
    """ConsistencyCheck: a survivor's signature of the survivor set it was sent."""

    KIND: ClassVar[int] = 7
    context: bytes
    sender: str
    signature: bytes

    def encode(self) -> bytes:
        """The message's bytes."""
        return Writer(self.KIND).blob(self.context).text(self.sender).blob(self.signature).finish()

    @classmethod
    def decode(cls, data: bytes | memoryview) -> ConsistencySignature:
        """Parse; every error a ``bad_message`` refusal."""
        reader = Reader(data, cls.KIND, what="consistency signature", stage="consistency")
        context = reader.blob("context", maximum=DIGEST_BYTES, exact=DIGEST_BYTES)
        sender = reader.text("sender")
        signature = reader.blob("signature", maximum=MAX_SIGNATURE_BYTES)
        reader.done()
        return cls(context, sender, signature)


@dataclass(frozen=True)
class UnmaskRequest:
    """The coordinator's call to unmask: U3, the dropped (U2 minus U3), and U3's signatures.

    Attributes:
        context: The session's context digest.
        survivors: U3, sorted.
        dropped: Participants whose masking keys are to be reconstructed, sorted.
        signatures: ``(signer, signature of U3)`` for every survivor that signed, sorted.
    """

    KIND: ClassVar[int] = 8
    context: bytes
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    signatures: tuple[tuple[str, bytes], ...]

    def encode(self) -> bytes:
        """The message's bytes."""
        out = Writer(self.KIND).blob(self.context)
        _put_ids(out, self.survivors)
        _put_ids(out, self.dropped)
        _put_pairs(out, self.signatures)
        return out.finish()

    @classmethod
    def decode(cls, data: bytes | memoryview) -> UnmaskRequest:
        """Parse; every error a ``bad_message`` refusal."""
        reader = Reader(data, cls.KIND, what="unmask request", stage="unmask")
        context = reader.blob("context", maximum=DIGEST_BYTES, exact=DIGEST_BYTES)
        survivors = _ids(reader, "survivors")
        dropped = _ids(reader, "dropped")
        signatures = _pairs(reader, "signatures", maximum=MAX_SIGNATURE_BYTES)
        reader.done()
        return cls(context, survivors, dropped, signatures)


@dataclass(frozen=True)
class UnmaskShares:
    """Unmasking: a survivor's shares of b_v for each v in U3 and of s_v^SK for each dropped v.

    Attributes:
        context: The session's context digest.
        sender: The participant revealing them.
        self_mask_shares: ``(owner, share)`` for every owner in U3, sorted.
        key_shares: ``(owner, share)`` for every dropped owner, sorted.
    """

    KIND: ClassVar[int] = 9
    context: bytes
    sender: str
    self_mask_shares: tuple[tuple[str, bytes], ...]
    key_shares: tuple[tuple[str, bytes], ...]

    def encode(self) -> bytes:
        """The message's bytes."""
        out = Writer(self.KIND).blob(self.context).text(self.sender)
        _put_pairs(out, self.self_mask_shares)
        _put_pairs(out, self.key_shares)
        return out.finish()

    @classmethod
    def decode(cls, data: bytes | memoryview) -> UnmaskShares:
        """Parse; every error a ``bad_message`` refusal."""
        reader = Reader(data, cls.KIND, what="unmask shares", stage="unmask")
        context = reader.blob("context", maximum=DIGEST_BYTES, exact=DIGEST_BYTES)
        sender = reader.text("sender")
        b_shares = _pairs(reader, "self-mask shares", maximum=SHARE_BYTES, exact=SHARE_BYTES)
        s_shares = _pairs(reader, "key shares", maximum=SHARE_BYTES, exact=SHARE_BYTES)
        reader.done()
        return cls(context, sender, b_shares, s_shares)
