"""A participant's side of one secure-aggregation session, as a state machine.

:class:`ParticipantSession` answers the coordinator's messages in order: :meth:`advertise`,
:meth:`share_keys`, :meth:`mask`, :meth:`check_consistency`, :meth:`unmask`. Each step is a
function of the message, the update and the secrets derived from the participant's seed. Before
it reveals anything it checks what the coordinator could have forged: every key is signed by
its owner's identity key, every share decrypts and authenticates, the survivor set it is asked
to unmask is the one it signed and at least t survivors signed the same set, and no peer is both
a survivor and dropped. The first refusal closes the session for good: it answers nothing more.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum

import numpy as np

from lensemble.federation.secagg import identity, shamir
from lensemble.federation.secagg.context import SessionContext
from lensemble.federation.secagg.errors import Reason, SecAggRefusal
from lensemble.federation.secagg.keys import (
    ParticipantSecrets,
    commitment,
    mask_sign,
    pairwise_key,
    self_mask_key,
    share_associated_data,
    share_encryption_key,
)
from lensemble.federation.secagg.messages import (
    ConsistencySignature,
    EncryptedShares,
    KeyAdvert,
    KeyRoster,
    MaskedInput,
    ShareDelivery,
    SurvivorSet,
    UnmaskRequest,
    UnmaskShares,
    consistency_bytes,
)
from lensemble.federation.secagg.primitives import (
    add_keystreams,
    agree,
    open_sealed,
    public_bytes,
    seal,
)


class Step(IntEnum):
    """The participant's progress; each method runs at exactly one step."""

    NEW = 0
    ADVERTISED = 1
    SHARED = 2
    MASKED = 3
    CHECKED = 4
    REVEALED = 5
    CLOSED = 6


class ParticipantSession:
    """One participant in one session.

    Args:
        context: The session's public parameters.
        participant: This participant's id (on ``context.roster``).
        seed: 32 secret bytes all of this session's secrets derive from.
        identity_key: The participant's mTLS identity private key (EC or Ed25519).
        verifiers: Every roster member's identity public key, from its certificate.
    """

    def __init__(
        self,
        context: SessionContext,
        participant: str,
        seed: bytes,
        identity_key: identity.SigningKey,
        verifiers: Mapping[str, identity.VerifyingKey],
    ) -> None:
        if participant not in context:
            raise ValueError(f"{participant!r} is not on the session's roster")
        identity.check_key_type(identity_key)
        self.context = context
        self.me = participant
        self._digest = context.digest
        self._secrets = ParticipantSecrets.derive(seed, self._digest, participant)
        self._identity = identity_key
        self._verifiers = dict(verifiers)
        self._step = Step.NEW
        self._adverts: dict[str, KeyAdvert] = {}
        self._held: dict[str, tuple[int, int]] = {}  # owner -> (b share, s share) for my point
        self._survivors: tuple[str, ...] = ()
        self.revealed: dict[str, str] = {}
        self.clipped = 0

    # ---------------------------------------------------------------------------- guards
    def _refuse(
        self, reason: Reason, message: str, *, stage: str, peer: str | None = None
    ) -> SecAggRefusal:
        self._step = Step.CLOSED
        return SecAggRefusal(
            reason,
            f"participant {self.me} refuses: {message}",
            stage=stage,
            participant=peer,
            remediation="The session is closed; nothing more is revealed.",
        )

    def _enter(self, expected: Step, stage: str, context: bytes) -> None:
        if self._step is Step.CLOSED:
            raise SecAggRefusal(
                Reason.SESSION_CLOSED, f"participant {self.me}'s session is closed.", stage=stage
            )
        if self._step is not expected:
            raise self._refuse(
                Reason.OUT_OF_ORDER,
                f"a {stage} step arrived at step {self._step.name}.",
                stage=stage,
            )
        if context != self._digest:
            raise self._refuse(
                Reason.WRONG_SESSION, "the message belongs to another session.", stage=stage
            )

    # ------------------------------------------------------------------------- AdvertiseKeys
    def advertise(self) -> KeyAdvert:
        """AdvertiseKeys: both public keys and the self-mask commitment, signed."""
        self._enter(Step.NEW, "advertise", self._digest)
        unsigned = KeyAdvert(
            context=self._digest,
            sender=self.me,
            encryption_key=public_bytes(self._secrets.encryption_key),
            masking_key=public_bytes(self._secrets.masking_key),
            commitment=commitment(self._secrets.self_mask_seed, self._digest, self.me),
            signature=b"",
        )
        signature = identity.sign(self._identity, unsigned.signed_bytes())
        self._own = KeyAdvert(**{**unsigned.__dict__, "signature": signature})
        self._step = Step.ADVERTISED
        return self._own

    # ----------------------------------------------------------------------------- ShareKeys
    def share_keys(self, roster: KeyRoster) -> EncryptedShares:
        """ShareKeys: check every advertised key, then share b_u and s_u^SK among U1.

        Raises:
            SecAggRefusal: ``wrong_session``, ``unknown_participant``, ``key_signature_invalid``
                (a substituted key, naming its owner), ``duplicate_key``, ``below_threshold``.
        """
        stage = "share"
        self._enter(Step.ADVERTISED, stage, roster.context)
        for advert in roster.adverts:
            self._check_advert(advert, stage)
        adverts = {a.sender: a for a in roster.adverts}
        if adverts.get(self.me) != self._own:
            raise self._refuse(
                Reason.KEY_SIGNATURE_INVALID,
                "the roster leaves out or replaces this participant's own keys.",
                stage=stage,
                peer=self.me,
            )
        seen: dict[bytes, str] = {}
        for advert in roster.adverts:
            for key in (advert.encryption_key, advert.masking_key):
                if key in seen:
                    raise self._refuse(
                        Reason.DUPLICATE_KEY,
                        f"{advert.sender} advertises a key that {seen[key]} advertised too.",
                        stage=stage,
                        peer=advert.sender,
                    )
                seen[key] = advert.sender
        self._at_least(len(adverts), "advertised keys", stage)
        self._adverts = adverts
        self._step = Step.SHARED
        return EncryptedShares(self._digest, self.me, self._encrypted_shares(stage))

    def _check_advert(self, advert: KeyAdvert, stage: str) -> None:
        verifier = self._verifiers.get(advert.sender)
        if advert.sender not in self.context or verifier is None:
            raise self._refuse(
                Reason.UNKNOWN_PARTICIPANT,
                f"the roster names {advert.sender!r}, who is not in the session.",
                stage=stage,
                peer=advert.sender,
            )
        if advert.context != self._digest:
            raise self._refuse(
                Reason.WRONG_SESSION,
                f"{advert.sender}'s keys belong to another session.",
                stage=stage,
                peer=advert.sender,
            )
        if not identity.verify(verifier, advert.signature, advert.signed_bytes()):
            raise self._refuse(
                Reason.KEY_SIGNATURE_INVALID,
                f"{advert.sender}'s keys are not signed by its identity key (substituted?).",
                stage=stage,
                peer=advert.sender,
            )

    def _at_least(self, count: int, what: str, stage: str) -> None:
        if count < self.context.min_survivors:
            raise self._refuse(
                Reason.BELOW_THRESHOLD,
                f"{count} {what}, fewer than the {self.context.min_survivors} a sum needs.",
                stage=stage,
            )

    def _encrypted_shares(self, stage: str) -> tuple[tuple[str, bytes], ...]:
        t = self.context.threshold
        b_coefficients, s_coefficients = self._secrets.coefficients(t)
        points = {self.context.point(p): p for p in self._adverts}
        b_secret = int.from_bytes(self._secrets.self_mask_seed, "big")
        s_secret = int.from_bytes(self._secrets.masking_key.private_bytes_raw(), "big")
        b_shares = shamir.split(b_secret, t, list(points), b_coefficients)
        s_shares = shamir.split(s_secret, t, list(points), s_coefficients)
        out: list[tuple[str, bytes]] = []
        for x, peer in sorted(points.items(), key=lambda item: item[1]):
            if peer == self.me:
                self._held[self.me] = (b_shares[x], s_shares[x])
                continue
            shared = agree(self._secrets.encryption_key, self._adverts[peer].encryption_key)
            if (
                shared is None
                or agree(self._secrets.masking_key, self._adverts[peer].masking_key) is None
            ):
                raise self._refuse(
                    Reason.KEY_SIGNATURE_INVALID,
                    f"{peer}'s advertised keys yield no shared secret (low-order keys).",
                    stage=stage,
                    peer=peer,
                )
            key = share_encryption_key(shared, self._digest, self.me, peer)
            plaintext = shamir.encode_share(b_shares[x]) + shamir.encode_share(s_shares[x])
            out.append(
                (peer, seal(key, plaintext, share_associated_data(self._digest, self.me, peer)))
            )
        return tuple(out)

    # ------------------------------------------------------------------- MaskedInputCollection
    def mask(self, delivery: ShareDelivery, update: np.ndarray) -> MaskedInput:
        """MaskedInputCollection: decrypt the shares received, then mask the update.

        Args:
            delivery: The shares of every other member of U2, for this participant.
            update: 1-D float32 or float64 vector of ``context.dimension`` values.

        Returns:
            ``y = encode(x) + PRG(b_u) + sum_v ±PRG(s_uv)`` over v in U2, mod 2**64.

        Raises:
            SecAggRefusal: ``share_tampered`` (naming the sender), ``unknown_participant``,
                ``below_threshold``, ``wrong_dimension``, ``non_finite_update``.
        """
        stage = "mask"
        self._enter(Step.SHARED, stage, delivery.context)
        if delivery.receiver != self.me:
            raise self._refuse(
                Reason.WRONG_RECIPIENTS,
                f"shares for {delivery.receiver} arrived here.",
                stage=stage,
            )
        for sender, ciphertext in delivery.ciphertexts:
            self._held[sender] = self._open_share(sender, ciphertext, stage)
        self._at_least(len(self._held), "participants shared keys", stage)
        vector = self._encode(update, stage)
        streams = [(self_mask_key(self._secrets.self_mask_seed, self._digest, self.me), +1)]
        for peer in sorted(self._held):
            if peer != self.me:
                key = pairwise_key(
                    self._secrets.masking_key,
                    self._adverts[peer].masking_key,
                    self._digest,
                    self.me,
                    peer,
                )
                assert (
                    key is not None
                )  # its encryption key agreed; a bad masking key is refused at share time
                streams.append((key, mask_sign(self.me, peer)))
        add_keystreams(vector, streams)
        self._step = Step.MASKED
        return MaskedInput(self._digest, self.me, vector)

    def _open_share(self, sender: str, ciphertext: bytes, stage: str) -> tuple[int, int]:
        advert = self._adverts.get(sender)
        if advert is None or sender == self.me:
            raise self._refuse(
                Reason.UNKNOWN_PARTICIPANT,
                f"shares arrived from {sender!r}, who advertised no keys.",
                stage=stage,
                peer=sender,
            )
        shared = agree(self._secrets.encryption_key, advert.encryption_key)
        key = share_encryption_key(shared or b"", self._digest, sender, self.me) if shared else None
        plaintext = (
            open_sealed(key, ciphertext, share_associated_data(self._digest, sender, self.me))
            if key
            else None
        )
        half = shamir.SHARE_BYTES
        b_share = shamir.decode_share(plaintext[:half]) if plaintext else None
        s_share = shamir.decode_share(plaintext[half:]) if plaintext else None
        if b_share is None or s_share is None:
            raise self._refuse(
                Reason.SHARE_TAMPERED,
                f"the shares from {sender} fail authentication (altered in transit).",
                stage=stage,
                peer=sender,
            )
        return b_share, s_share

    def _encode(self, update: np.ndarray, stage: str) -> np.ndarray:
        d = self.context.dimension
        if update.ndim != 1 or len(update) != d or update.dtype.kind != "f":
            raise self._refuse(
                Reason.WRONG_DIMENSION,
                f"the update is {update.dtype} of shape {update.shape}, not ({d},) floats.",
                stage=stage,
            )
        vector = np.empty(self.context.words, dtype="<u8")
        try:
            self.clipped = self.context.codec.encode_into(update, vector[:d])
        except ValueError as exc:
            raise self._refuse(
                Reason.NON_FINITE_UPDATE, f"{exc}.", stage=stage, peer=self.me
            ) from None
        vector[d] = self.clipped
        vector[d + 1] = 1
        return vector

    # ----------------------------------------------------------------------- ConsistencyCheck
    def check_consistency(self, survivors: SurvivorSet) -> ConsistencySignature:
        """ConsistencyCheck: sign U3 once it is a large enough subset of U2 that includes us.

        Raises:
            SecAggRefusal: ``survivor_set_inconsistent``, ``below_threshold``.
        """
        stage = "consistency"
        self._enter(Step.MASKED, stage, survivors.context)
        extra = [p for p in survivors.survivors if p not in self._held]
        if extra or self.me not in survivors.survivors:
            named = extra[0] if extra else self.me
            raise self._refuse(
                Reason.SURVIVOR_SET_INCONSISTENT,
                f"the survivor set names {named}, who shared no keys."
                if extra
                else "the survivor set leaves out this participant.",
                stage=stage,
                peer=named,
            )
        self._at_least(len(survivors.survivors), "survivors", stage)
        self._survivors = survivors.survivors
        signed = consistency_bytes(self._digest, self.me, self._survivors)
        self._step = Step.CHECKED
        return ConsistencySignature(self._digest, self.me, identity.sign(self._identity, signed))

    # ------------------------------------------------------------------------------ Unmasking
    def unmask(self, request: UnmaskRequest) -> UnmaskShares:
        """Unmasking: reveal b-shares of the survivors and key shares of the dropped.

        Raises:
            SecAggRefusal: ``double_reveal`` (a peer asked for as survivor and as dropped, named),
                ``survivor_set_inconsistent`` (not the set signed here, or a signature over
                another set, naming the signer), ``below_threshold`` (fewer than t signatures),
                ``unsigned_survivor`` (with ``every_signs``: a survivor's signature is missing,
                naming it).
        """
        stage = "unmask"
        self._enter(Step.CHECKED, stage, request.context)
        both = sorted(set(request.survivors) & set(request.dropped))
        if both:
            raise self._refuse(
                Reason.DOUBLE_REVEAL,
                f"asked to reveal both secrets of {both[0]} (survivor and dropped).",
                stage=stage,
                peer=both[0],
            )
        dropped = tuple(p for p in sorted(self._held) if p not in self._survivors)
        if request.survivors != self._survivors or request.dropped != dropped:
            odd = sorted(
                set(request.survivors) ^ set(self._survivors) | set(request.dropped) ^ set(dropped)
            )
            raise self._refuse(
                Reason.SURVIVOR_SET_INCONSISTENT,
                "the unmask request's survivors or dropped differ from the set signed here "
                f"({', '.join(odd)}).",
                stage=stage,
                peer=odd[0] if odd else None,
            )
        self._check_signatures(request, stage)
        for owner in self._survivors:
            self._record(owner, "self-mask seed", stage)
        for owner in dropped:
            self._record(owner, "masking key", stage)
        self._step = Step.REVEALED
        return UnmaskShares(
            self._digest,
            self.me,
            tuple((o, shamir.encode_share(self._held[o][0])) for o in self._survivors),
            tuple((o, shamir.encode_share(self._held[o][1])) for o in dropped),
        )

    def _check_signatures(self, request: UnmaskRequest, stage: str) -> None:
        for signer, signature in request.signatures:
            verifier = self._verifiers.get(signer)
            signed = consistency_bytes(self._digest, signer, self._survivors)
            if (
                signer not in self._survivors
                or verifier is None
                or not identity.verify(verifier, signature, signed)
            ):
                raise self._refuse(
                    Reason.SURVIVOR_SET_INCONSISTENT,
                    f"{signer}'s consistency signature is not over the survivor set signed here "
                    "(the coordinator sent different sets).",
                    stage=stage,
                    peer=signer,
                )
        if len(request.signatures) < self.context.threshold:
            raise self._refuse(
                Reason.BELOW_THRESHOLD,
                f"{len(request.signatures)} survivors signed the survivor set, fewer than "
                f"t = {self.context.threshold}.",
                stage=stage,
            )
        unsigned = sorted(set(self._survivors) - {signer for signer, _ in request.signatures})
        if unsigned and self.context.every_signs:
            # With several groups a retry regroups updates with other partners: an input must
            # be unmasked only where its owner signed (and so will mask nothing more this round).
            raise self._refuse(
                Reason.UNSIGNED_SURVIVOR,
                f"{unsigned[0]} did not sign the survivor set ({len(unsigned)} survivors "
                "unsigned); with several groups every survivor signs before anything is "
                "revealed.",
                stage=stage,
                peer=unsigned[0],
            )

    def _record(self, owner: str, secret: str, stage: str) -> None:
        earlier = self.revealed.get(owner)
        if earlier is not None and earlier != secret:
            raise self._refuse(
                Reason.DOUBLE_REVEAL,
                f"asked to reveal {owner}'s {secret} after its {earlier}.",
                stage=stage,
                peer=owner,
            )
        self.revealed[owner] = secret
