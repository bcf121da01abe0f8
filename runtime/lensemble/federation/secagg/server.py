"""The coordinator's side of one secure-aggregation session, as a state machine.

:class:`ServerSession` collects each stage's messages (``receive_*``, in any order) and closes
the stage (``close_*``) when the transport's deadline for it passes: AdvertiseKeys gives U1,
ShareKeys U2, MaskedInputCollection U3, ConsistencyCheck U4 and Unmasking U5, each a subset of
the one before. A message that fails a check is refused (:class:`SecAggRefusal`, kept in
:attr:`ServerSession.refusals`) and its sender is treated as dropped; a stage that closes with
too few participants aborts the session (:class:`SecAggAbort`). Masked vectors are added to one
uint64 accumulator as they arrive and never kept, so memory is O(d) whatever n is. The result,
:class:`SecureSum`, is the same bits for every arrival order: sums mod 2**64 commute and every
reconstruction picks its shares in roster order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from lensemble.federation.secagg import identity, shamir
from lensemble.federation.secagg.context import SessionContext
from lensemble.federation.secagg.errors import Reason, SecAggAbort, SecAggRefusal
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
from lensemble.federation.secagg.unmask import Unmasker


class Stage(IntEnum):
    """The stage whose messages the session accepts."""

    ADVERTISE = 0
    SHARE = 1
    MASK = 2
    CONSISTENCY = 3
    UNMASK = 4
    DONE = 5


_NAMES = {s: s.name.lower() for s in Stage}


@dataclass(frozen=True)
class SecureSum:
    """What a finished session gives the coordinator: the sum and who is in it.

    Attributes:
        total: The sum of the survivors' encoded updates, d uint64 words (int64 two's
            complement; decode with ``context.codec``).
        clipped: Coordinates clipped across all survivors' updates (count).
        advertised: U1; shared: U2; survivors: U3 (whose inputs are summed); signed: U4;
        unmasked: U5 (who revealed shares); all sorted.
        refusals: ``(participant, reason)`` of every refused message, in arrival order.
    """

    total: np.ndarray
    clipped: int
    advertised: tuple[str, ...]
    shared: tuple[str, ...]
    survivors: tuple[str, ...]
    signed: tuple[str, ...]
    unmasked: tuple[str, ...]
    refusals: tuple[tuple[str, str], ...]

    @property
    def dropped(self) -> tuple[str, ...]:
        """U2 minus U3: participants whose masking keys were reconstructed."""
        return tuple(p for p in self.shared if p not in self.survivors)

    def digest(self) -> str:
        """SHA-256 over the sorted survivors and the sum's bytes (hex), for the ledger."""
        h = hashlib.sha256(b"lensemble-secagg-sum-v1")
        for participant in self.survivors:
            h.update(participant.encode() + b"\n")
        h.update(np.ascontiguousarray(self.total, dtype="<u8").tobytes())
        return h.hexdigest()


class ServerSession:
    """The coordinator in one session.

    Args:
        context: The session's public parameters.
        verifiers: Every roster member's identity public key, from its certificate.
    """

    def __init__(
        self, context: SessionContext, verifiers: Mapping[str, identity.VerifyingKey]
    ) -> None:
        self.context = context
        self._digest = context.digest
        self._verifiers = dict(verifiers)
        self._stage = Stage.ADVERTISE
        self.refusals: list[SecAggRefusal] = []
        self._adverts: dict[str, KeyAdvert] = {}
        self._ciphertexts: dict[str, dict[str, bytes]] = {}
        self._sum = np.zeros(context.words, dtype="<u8")
        self._masked: set[str] = set()
        self._signatures: dict[str, bytes] = {}
        self._revealed: dict[str, UnmaskShares] = {}
        self._u1: tuple[str, ...] = ()
        self._u2: tuple[str, ...] = ()
        self._u3: tuple[str, ...] = ()
        self._u4: tuple[str, ...] = ()

    # ---------------------------------------------------------------------------- guards
    def _refuse(self, reason: Reason, sender: str, message: str) -> SecAggRefusal:
        refusal = SecAggRefusal(
            reason,
            f"the coordinator refuses {sender}'s message: {message}",
            stage=_NAMES[self._stage],
            participant=sender,
            remediation="The sender is treated as dropped from this session.",
        )
        self.refusals.append(refusal)
        return refusal

    def _enter(
        self,
        stage: Stage,
        context: bytes,
        sender: str,
        members: tuple[str, ...] | None,
        seen: object,
    ) -> None:
        if self._stage is not stage:
            raise self._refuse(
                Reason.OUT_OF_ORDER,
                sender,
                f"it belongs to {_NAMES[stage]}, not {_NAMES[self._stage]}.",
            )
        if context != self._digest:
            raise self._refuse(Reason.WRONG_SESSION, sender, "it belongs to another session.")
        allowed = sender in self.context if members is None else sender in members
        if not allowed:
            raise self._refuse(
                Reason.UNKNOWN_PARTICIPANT, sender, "the sender is not in this stage's set."
            )
        if sender in seen:  # type: ignore[operator]
            raise self._refuse(
                Reason.DUPLICATE_MESSAGE, sender, "it sent this stage's message twice."
            )

    def _abort(
        self, reason: Reason, message: str, participants: tuple[str, ...] = ()
    ) -> SecAggAbort:
        stage = _NAMES[self._stage]
        self._stage = Stage.DONE
        return SecAggAbort(
            reason,
            message,
            stage=stage,
            participants=participants,
            remediation="The round does not commit; it is retried as a fresh attempt.",
        )

    def _enough(self, members: tuple[str, ...], needed: int, what: str) -> tuple[str, ...]:
        if len(members) < needed:
            raise self._abort(
                Reason.BELOW_THRESHOLD,
                f"{len(members)} participants {what}, fewer than the {needed} needed.",
                members,
            )
        return members

    # ------------------------------------------------------------------------- AdvertiseKeys
    def receive_advert(self, advert: KeyAdvert) -> None:
        """Accept one participant's signed keys.

        Raises:
            SecAggRefusal: ``key_signature_invalid`` and the usual stage checks.
        """
        self._enter(Stage.ADVERTISE, advert.context, advert.sender, None, self._adverts)
        verifier = self._verifiers.get(advert.sender)
        if verifier is None or not identity.verify(
            verifier, advert.signature, advert.signed_bytes()
        ):
            raise self._refuse(
                Reason.KEY_SIGNATURE_INVALID,
                advert.sender,
                "its keys are not signed by its identity key.",
            )
        self._adverts[advert.sender] = advert

    def close_advertising(self) -> KeyRoster:
        """U1: every advertisement with keys no one else advertised, broadcast to all of them.

        Raises:
            SecAggAbort: ``below_threshold``: fewer than ``context.min_survivors``.
        """
        owners: dict[bytes, list[str]] = {}
        for advert in self._adverts.values():
            for key in (advert.encryption_key, advert.masking_key):
                owners.setdefault(key, []).append(advert.sender)
        for senders in owners.values():
            for sender in senders if len(senders) > 1 else ():
                if self._adverts.pop(sender, None) is not None:
                    self._refuse(
                        Reason.DUPLICATE_KEY,
                        sender,
                        f"its key is advertised by {', '.join(senders)}.",
                    )
        self._u1 = self._enough(
            tuple(sorted(self._adverts)), self.context.min_survivors, "advertised keys"
        )
        self._stage = Stage.SHARE
        return KeyRoster(self._digest, tuple(self._adverts[p] for p in self._u1))

    # ----------------------------------------------------------------------------- ShareKeys
    def receive_shares(self, shares: EncryptedShares) -> None:
        """Accept one participant's encrypted shares: exactly one for every other member of U1.

        Raises:
            SecAggRefusal: ``wrong_recipients`` and the usual stage checks.
        """
        self._enter(Stage.SHARE, shares.context, shares.sender, self._u1, self._ciphertexts)
        receivers = tuple(r for r, _ in shares.ciphertexts)
        if receivers != tuple(p for p in self._u1 if p != shares.sender):
            raise self._refuse(
                Reason.WRONG_RECIPIENTS,
                shares.sender,
                "its shares are not addressed to exactly the other members of U1.",
            )
        self._ciphertexts[shares.sender] = dict(shares.ciphertexts)

    def close_sharing(self) -> dict[str, ShareDelivery]:
        """U2: the participants that shared; each gets the ciphertexts addressed to it.

        Raises:
            SecAggAbort: ``below_threshold``.
        """
        self._u2 = self._enough(
            tuple(sorted(self._ciphertexts)), self.context.min_survivors, "shared keys"
        )
        self._stage = Stage.MASK
        return {
            v: ShareDelivery(
                self._digest, v, tuple((u, self._ciphertexts[u][v]) for u in self._u2 if u != v)
            )
            for v in self._u2
        }

    # ------------------------------------------------------------------- MaskedInputCollection
    def receive_masked(self, masked: MaskedInput) -> None:
        """Add one masked vector to the running sum (it is not kept).

        Raises:
            SecAggRefusal: ``wrong_dimension`` and the usual stage checks.
        """
        self._enter(Stage.MASK, masked.context, masked.sender, self._u2, self._masked)
        if masked.vector.dtype != np.dtype("<u8") or masked.vector.shape != (self.context.words,):
            raise self._refuse(
                Reason.WRONG_DIMENSION,
                masked.sender,
                f"its vector has {masked.vector.size} words, not {self.context.words}.",
            )
        np.add(self._sum, masked.vector, out=self._sum)
        self._masked.add(masked.sender)

    def close_masking(self) -> SurvivorSet:
        """U3: the participants whose masked vectors are in the sum; late ones are refused.

        Raises:
            SecAggAbort: ``below_threshold``.
        """
        self._u3 = self._enough(
            tuple(sorted(self._masked)), self.context.min_survivors, "uploaded masked inputs"
        )
        self._stage = Stage.CONSISTENCY
        return SurvivorSet(self._digest, self._u3)

    # ----------------------------------------------------------------------- ConsistencyCheck
    def receive_consistency(self, signature: ConsistencySignature) -> None:
        """Accept one survivor's signature of U3.

        Raises:
            SecAggRefusal: ``survivor_set_inconsistent`` (a signature over another set).
        """
        self._enter(
            Stage.CONSISTENCY, signature.context, signature.sender, self._u3, self._signatures
        )
        signed = consistency_bytes(self._digest, signature.sender, self._u3)
        if not identity.verify(self._verifiers[signature.sender], signature.signature, signed):
            raise self._refuse(
                Reason.SURVIVOR_SET_INCONSISTENT,
                signature.sender,
                "its signature is not over the survivor set.",
            )
        self._signatures[signature.sender] = signature.signature

    def close_consistency(self) -> UnmaskRequest:
        """U4: the survivors that signed; at least t of them, or every one of U3.

        With ``context.every_signs`` (several groups) every survivor must sign: an honest
        participant then reveals nothing unless each survivor's signature is shown, so an input
        is unmasked only in a session whose survivor set its owner signed, and an owner signs in
        one attempt of a round at most
        (:class:`~lensemble.federation.masking_client.MaskingClient`). A survivor that does not
        sign then costs the session (docs/security.md, *one sum per update*).

        Raises:
            SecAggAbort: ``below_threshold``, or ``unsigned_survivor`` (naming who did not).
        """
        unsigned = tuple(p for p in self._u3 if p not in self._signatures)
        if unsigned and self.context.every_signs:
            raise self._abort(
                Reason.UNSIGNED_SURVIVOR,
                f"{len(unsigned)} of the {len(self._u3)} survivors did not sign the survivor "
                f"set ({', '.join(unsigned[:5])}); no share is asked for.",
                unsigned,
            )
        self._u4 = self._enough(
            tuple(sorted(self._signatures)), self.context.threshold, "signed the survivor set"
        )
        self._stage = Stage.UNMASK
        dropped = tuple(p for p in self._u2 if p not in self._u3)
        return UnmaskRequest(
            self._digest, self._u3, dropped, tuple((p, self._signatures[p]) for p in self._u4)
        )

    @property
    def signers(self) -> tuple[str, ...]:
        """Who sent a valid signature of the survivor set, sorted (U4 once the stage closed).

        Each of them takes part in no later attempt of the round, whatever became of the
        session, so the coordinator leaves them out of its retries.
        """
        return tuple(sorted(self._signatures))

    def abandon(self, message: str) -> SecAggAbort:
        """End the session after its masked upload: the attempt cannot commit (below quorum).

        Called before anyone is asked to sign the survivor set, so no participant has agreed to
        an unmasking and each may mask again in the round's next attempt.

        Returns:
            The ``below_quorum`` abort, naming the session's survivors (U3).
        """
        return self._abort(Reason.BELOW_QUORUM, message, self._u3)

    # ------------------------------------------------------------------------------ Unmasking
    def receive_unmask(self, shares: UnmaskShares) -> None:
        """Accept one survivor's shares: b-shares of exactly U3, key shares of exactly U2 - U3.

        Raises:
            SecAggRefusal: ``wrong_recipients``, ``bad_message`` and the usual stage checks.
        """
        self._enter(Stage.UNMASK, shares.context, shares.sender, self._u4, self._revealed)
        dropped = tuple(p for p in self._u2 if p not in self._u3)
        owners_b = tuple(o for o, _ in shares.self_mask_shares)
        owners_s = tuple(o for o, _ in shares.key_shares)
        if owners_b != self._u3 or owners_s != dropped:
            raise self._refuse(
                Reason.WRONG_RECIPIENTS,
                shares.sender,
                "its shares are not of exactly the survivors and the dropped.",
            )
        values = [*shares.self_mask_shares, *shares.key_shares]
        if any(shamir.decode_share(v) is None for _, v in values):
            raise self._refuse(Reason.BAD_MESSAGE, shares.sender, "a share is not a field element.")
        self._revealed[shares.sender] = shares

    def finish(self) -> SecureSum:
        """Reconstruct the survivors' self masks and the dropped's masking keys; unmask the sum.

        Raises:
            SecAggAbort: ``below_threshold`` (fewer than t revealed), ``reconstruction_failed``
                (no t shares of a secret match its public key or commitment, naming its owner),
                ``unmask_check_failed`` (the unmasked count word is not |U3|).
        """
        t = self.context.threshold
        u5 = self._enough(tuple(sorted(self._revealed)), t, "revealed their shares")
        unmasker = Unmasker(self.context, self._adverts, self._revealed)
        try:
            unmasker.remove_masks(
                self._sum, self._u3, tuple(p for p in self._u2 if p not in self._u3)
            )
        except LookupError as exc:
            owner = str(exc.args[0])
            raise self._abort(
                Reason.RECONSTRUCTION_FAILED,
                f"no {t} shares of {owner}'s secret match its public key or commitment.",
                (owner,),
            ) from None
        for revealer in unmasker.wrong_revealers:
            self._refuse(
                Reason.SHARE_TAMPERED,
                revealer,
                "a share it revealed is not on the owner's polynomial.",
            )
        d = self.context.dimension
        if int(self._sum[d + 1]) != len(self._u3):
            raise self._abort(
                Reason.UNMASK_CHECK_FAILED,
                f"the unmasked input count is {int(self._sum[d + 1])}, not {len(self._u3)}.",
            )
        self._stage = Stage.DONE
        return SecureSum(
            total=self._sum[:d],
            clipped=int(self._sum[d]),
            advertised=self._u1,
            shared=self._u2,
            survivors=self._u3,
            signed=self._u4,
            unmasked=u5,
            refusals=tuple((r.participant or "", r.reason.value) for r in self.refusals),
        )
