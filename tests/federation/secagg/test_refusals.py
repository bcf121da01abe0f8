"""Every abort path is refused and named: what a hostile coordinator or participant can try.

A substituted key, a tampered share (in transit, or revealed wrong), different survivor sets
sent to different participants, a request to reveal both secrets of one peer, messages out of
order, from another session, or malformed. Each refusal carries a stable reason and names the
participant at fault; a refusing participant reveals nothing more.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lensemble.federation.secagg.errors import Reason, SecAggAbort, SecAggRefusal
from lensemble.federation.secagg.local import DropAfter
from lensemble.federation.secagg.messages import (
    KeyAdvert,
    KeyRoster,
    ShareDelivery,
    SurvivorSet,
    UnmaskRequest,
    UnmaskShares,
)
from lensemble.federation.secagg.participant import ParticipantSession
from lensemble.federation.secagg.server import ServerSession
from tests.federation.secagg.helpers import context, identity_keys, plain_sum, run, seeds, updates


class Session:
    """Every party of one session, stepped by hand up to the unmask request."""

    def __init__(self, n: int = 6, d: int = 32) -> None:
        self.ctx = context(n, d)
        keys = identity_keys(self.ctx.roster)
        self.verifiers = {p: k.public_key() for p, k in keys.items()}
        secrets = seeds(self.ctx.roster)
        self.parties = {
            p: ParticipantSession(self.ctx, p, secrets[p], keys[p], self.verifiers)
            for p in self.ctx.roster
        }
        self.server = ServerSession(self.ctx, self.verifiers)
        self.ups = updates(self.ctx.roster, d)

    def to_sharing(self) -> KeyRoster:
        for party in self.parties.values():
            self.server.receive_advert(party.advertise())
        return self.server.close_advertising()

    def to_masking(self) -> dict[str, ShareDelivery]:
        roster = self.to_sharing()
        for party in self.parties.values():
            self.server.receive_shares(party.share_keys(roster))
        return self.server.close_sharing()

    def to_consistency(self, *, skip: tuple[str, ...] = ()) -> SurvivorSet:
        deliveries = self.to_masking()
        for p, party in self.parties.items():
            if p not in skip:
                self.server.receive_masked(party.mask(deliveries[p], self.ups[p]))
        return self.server.close_masking()

    def to_unmask(self, *, skip: tuple[str, ...] = ()) -> UnmaskRequest:
        survivors = self.to_consistency(skip=skip)
        for p in survivors.survivors:
            self.server.receive_consistency(self.parties[p].check_consistency(survivors))
        return self.server.close_consistency()


def refused(call, reason: Reason) -> SecAggRefusal:  # type: ignore[no-untyped-def]
    with pytest.raises(SecAggRefusal) as caught:
        call()
    assert caught.value.reason is reason, caught.value
    return caught.value


# ------------------------------------------------------------------------- substituted keys
def test_a_substituted_key_is_refused_by_every_participant_naming_its_owner() -> None:
    ctx = context(6, 16)
    victim = ctx.roster[2]

    def substitute(stage: str, who: str, data: bytes) -> bytes:
        if stage != "share":
            return data
        roster = KeyRoster.decode(data)
        forged = tuple(
            dataclasses.replace(a, masking_key=bytes(31) + b"\x09") if a.sender == victim else a
            for a in roster.adverts
        )
        return KeyRoster(roster.context, forged).encode()

    with pytest.raises(SecAggAbort) as caught:
        run(ctx, updates(ctx.roster, 16), tamper=substitute)
    assert caught.value.reason is Reason.BELOW_THRESHOLD  # nobody shared
    # (the driver keeps refusals on the result, which an abort does not return: step by hand)
    s = Session()
    roster = s.to_sharing()
    forged = KeyRoster(
        roster.context,
        tuple(
            dataclasses.replace(a, encryption_key=bytes(32)) if a.sender == s.ctx.roster[2] else a
            for a in roster.adverts
        ),
    )
    for p, party in s.parties.items():
        refusal = refused(
            lambda party=party: party.share_keys(forged), Reason.KEY_SIGNATURE_INVALID
        )
        assert refusal.participant == s.ctx.roster[2]
        assert "substituted" in str(refusal) or p == s.ctx.roster[2]


def test_the_coordinator_refuses_an_advert_its_sender_did_not_sign() -> None:
    s = Session()
    advert = s.parties[s.ctx.roster[0]].advertise()
    forged = dataclasses.replace(advert, sender=s.ctx.roster[1])
    refusal = refused(lambda: s.server.receive_advert(forged), Reason.KEY_SIGNATURE_INVALID)
    assert refusal.participant == s.ctx.roster[1]


def test_a_copied_key_is_refused_as_duplicate() -> None:
    s = Session(n=8)  # t = 6: two left out still leave enough
    roster = s.to_sharing()
    a, b = roster.adverts[0], roster.adverts[1]
    # A roster where b carries a's key (with a valid signature it would need b's identity key:
    # the participant checks signatures first, so give b's own advert a's key and re-sign it).
    from lensemble.federation.secagg import identity

    keys = identity_keys(s.ctx.roster)
    copied = dataclasses.replace(b, masking_key=a.masking_key, signature=b"")
    copied = dataclasses.replace(
        copied, signature=identity.sign(keys[b.sender], copied.signed_bytes())
    )
    forged = KeyRoster(roster.context, (a, copied, *roster.adverts[2:]))
    refusal = refused(lambda: s.parties[s.ctx.roster[3]].share_keys(forged), Reason.DUPLICATE_KEY)
    assert refusal.participant == b.sender
    # The coordinator leaves out every participant advertising a key another advertised.
    server = ServerSession(s.ctx, s.verifiers)
    for advert in (a, copied, *roster.adverts[2:]):
        server.receive_advert(advert)
    assert [x.sender for x in server.close_advertising().adverts] == list(s.ctx.roster[2:])
    assert {(r.participant, r.reason) for r in server.refusals} == {
        (a.sender, Reason.DUPLICATE_KEY),
        (b.sender, Reason.DUPLICATE_KEY),
    }


# ------------------------------------------------------------------------- tampered shares
def test_a_share_tampered_in_transit_is_refused_naming_its_sender() -> None:
    s = Session()
    deliveries = s.to_masking()
    target = s.ctx.roster[4]
    sender, ciphertext = deliveries[target].ciphertexts[1]
    flipped = bytes([ciphertext[0] ^ 0x80]) + ciphertext[1:]
    forged = dataclasses.replace(
        deliveries[target],
        ciphertexts=tuple(
            (u, flipped if u == sender else c) for u, c in deliveries[target].ciphertexts
        ),
    )
    refusal = refused(lambda: s.parties[target].mask(forged, s.ups[target]), Reason.SHARE_TAMPERED)
    assert refusal.participant == sender
    refused(
        lambda: s.parties[target].mask(deliveries[target], s.ups[target]), Reason.SESSION_CLOSED
    )


def test_shares_swapped_between_senders_fail_authentication() -> None:
    s = Session()
    deliveries = s.to_masking()
    target = s.ctx.roster[0]
    (u, cu), (v, cv) = deliveries[target].ciphertexts[:2]
    swapped = dataclasses.replace(
        deliveries[target], ciphertexts=((u, cv), (v, cu), *deliveries[target].ciphertexts[2:])
    )
    assert (
        refused(
            lambda: s.parties[target].mask(swapped, s.ups[target]), Reason.SHARE_TAMPERED
        ).participant
        == u
    )


def _lie(liar: str, n_shares_ok: bool = True):  # type: ignore[no-untyped-def]
    def forge(stage: str, who: str, data: bytes) -> bytes:
        if stage != "unmask" or who != liar:
            return data
        shares = UnmaskShares.decode(data)
        owner, share = shares.self_mask_shares[0]
        wrong = (int.from_bytes(share, "big") + 1).to_bytes(66, "big")
        return dataclasses.replace(
            shares, self_mask_shares=((owner, wrong), *shares.self_mask_shares[1:])
        ).encode()

    return forge


def test_a_wrong_revealed_share_is_named_and_outvoted_by_spare_shares() -> None:
    ctx = context(8, 32)  # t = 6, 8 reveal
    ups = updates(ctx.roster, 32)
    liar = ctx.roster[5]
    result = run(ctx, ups, forge=_lie(liar))
    assert result.sum.total.tobytes() == plain_sum(ctx, ups, ctx.roster).tobytes()
    assert (liar, Reason.SHARE_TAMPERED.value) in result.sum.refusals


def test_a_wrong_share_among_exactly_t_aborts_naming_the_owner() -> None:
    ctx = context(6, 32)  # t = 5
    liar = ctx.roster[1]
    with pytest.raises(SecAggAbort) as caught:
        run(
            ctx,
            updates(ctx.roster, 32),
            forge=_lie(liar),
            drop={ctx.roster[3]: DropAfter.CONSISTENCY},
        )
    assert caught.value.reason is Reason.RECONSTRUCTION_FAILED
    assert caught.value.participants == (ctx.roster[0],)  # the owner of the first share it altered


# ------------------------------------------------------------------ inconsistent survivor sets
def test_different_survivor_sets_sent_to_different_participants_are_refused() -> None:
    s = Session(n=6)  # t = 5
    survivors = s.to_consistency()
    everyone = survivors.survivors
    without_last = SurvivorSet(survivors.context, everyone[:-1])
    # The coordinator tells half the full set and the other half a set without the last one.
    signatures = {}
    for i, p in enumerate(everyone[:-1]):
        told = survivors if i % 2 else without_last
        signatures[p] = (told, s.parties[p].check_consistency(told).signature)
    # To those told the full set it forwards every signature, and claims the last one dropped
    # to the others: whichever set each was told, someone's signature covers another set.
    full_request = UnmaskRequest(
        survivors.context,
        everyone,
        (),
        tuple((p, sig) for p, (_, sig) in sorted(signatures.items())),
    )
    told_full = everyone[1]
    refusal = refused(
        lambda: s.parties[told_full].unmask(full_request), Reason.SURVIVOR_SET_INCONSISTENT
    )
    assert refusal.participant == everyone[0]  # it signed the other set
    told_short = everyone[0]
    short_request = dataclasses.replace(
        full_request, survivors=without_last.survivors, dropped=(everyone[-1],)
    )
    refusal = refused(
        lambda: s.parties[told_short].unmask(short_request), Reason.SURVIVOR_SET_INCONSISTENT
    )
    assert refusal.participant == everyone[1]


def test_an_unmask_request_for_a_set_other_than_the_signed_one_is_refused() -> None:
    s = Session(n=6)
    request = s.to_unmask()
    moved = request.survivors[3]
    forged = dataclasses.replace(
        request, survivors=tuple(p for p in request.survivors if p != moved), dropped=(moved,)
    )
    refusal = refused(
        lambda: s.parties[request.survivors[0]].unmask(forged), Reason.SURVIVOR_SET_INCONSISTENT
    )
    assert refusal.participant == moved


def test_the_coordinator_refuses_a_signature_over_another_set() -> None:
    s = Session(n=6)
    survivors = s.to_consistency()
    other = SurvivorSet(survivors.context, survivors.survivors[:-1])
    p = survivors.survivors[0]
    signature = s.parties[p].check_consistency(other)
    refusal = refused(
        lambda: s.server.receive_consistency(signature), Reason.SURVIVOR_SET_INCONSISTENT
    )
    assert refusal.participant == p


def test_fewer_than_t_signatures_are_refused() -> None:
    s = Session(n=6)
    request = s.to_unmask()
    short = dataclasses.replace(request, signatures=request.signatures[:4])
    refused(lambda: s.parties[request.survivors[0]].unmask(short), Reason.BELOW_THRESHOLD)


# ------------------------------------------------------------------------- double reveal
def test_a_participant_asked_to_reveal_both_secrets_of_a_peer_refuses_naming_it() -> None:
    s = Session(n=6)
    request = s.to_unmask()
    peer = request.survivors[2]
    both = dataclasses.replace(request, dropped=(peer,))
    me = request.survivors[0]
    refusal = refused(lambda: s.parties[me].unmask(both), Reason.DOUBLE_REVEAL)
    assert refusal.participant == peer
    assert s.parties[me].revealed == {}  # nothing was revealed
    refused(lambda: s.parties[me].unmask(request), Reason.SESSION_CLOSED)


def test_a_participant_reveals_once_and_one_secret_per_peer() -> None:
    s = Session(n=6)
    late = s.ctx.roster[5]
    request = s.to_unmask(skip=(late,))  # `late` shared keys but never uploaded: dropped
    me = request.survivors[0]
    shares = s.parties[me].unmask(request)
    assert [o for o, _ in shares.key_shares] == [late]
    assert [o for o, _ in shares.self_mask_shares] == list(request.survivors)
    assert s.parties[me].revealed[late] == "masking key"
    assert all(s.parties[me].revealed[o] == "self-mask seed" for o in request.survivors)
    refused(lambda: s.parties[me].unmask(request), Reason.OUT_OF_ORDER)


def test_the_coordinator_refuses_shares_of_the_wrong_owners() -> None:
    s = Session(n=6)
    late = s.ctx.roster[5]
    request = s.to_unmask(skip=(late,))
    me = request.survivors[0]
    shares = s.parties[me].unmask(request)
    greedy = dataclasses.replace(
        shares, self_mask_shares=(*shares.self_mask_shares, (late, shares.key_shares[0][1]))
    )
    refusal = refused(lambda: s.server.receive_unmask(greedy), Reason.WRONG_RECIPIENTS)
    assert refusal.participant == me


# ------------------------------------------------------------------- order, session, bytes
def test_steps_out_of_order_and_from_another_session_are_refused() -> None:
    s = Session()
    p = s.ctx.roster[0]
    roster = s.to_sharing()
    refused(
        lambda: s.parties[p].check_consistency(SurvivorSet(roster.context, s.ctx.roster)),
        Reason.OUT_OF_ORDER,
    )
    other = Session()
    other_roster = KeyRoster(bytes(32), roster.adverts)
    refused(
        lambda: other.parties[p].advertise() and other.parties[p].share_keys(other_roster),
        Reason.WRONG_SESSION,
    )
    refusal = refused(lambda: s.server.receive_advert(roster.adverts[0]), Reason.OUT_OF_ORDER)
    assert refusal.participant == p


def test_the_coordinator_refuses_unknown_duplicate_and_misaddressed_messages() -> None:
    s = Session()
    first = s.parties[s.ctx.roster[0]].advertise()
    s.server.receive_advert(first)
    refused(lambda: s.server.receive_advert(first), Reason.DUPLICATE_MESSAGE)
    stranger = dataclasses.replace(first, sender="stranger")
    refused(lambda: s.server.receive_advert(stranger), Reason.UNKNOWN_PARTICIPANT)
    for party in list(s.parties.values())[1:]:
        s.server.receive_advert(party.advertise())
    roster = s.server.close_advertising()
    shares = s.parties[s.ctx.roster[1]].share_keys(roster)
    short = dataclasses.replace(shares, ciphertexts=shares.ciphertexts[1:])
    refused(lambda: s.server.receive_shares(short), Reason.WRONG_RECIPIENTS)


def test_a_masked_vector_of_the_wrong_length_is_refused() -> None:
    s = Session(d=32)
    deliveries = s.to_masking()
    p = s.ctx.roster[0]
    masked = s.parties[p].mask(deliveries[p], s.ups[p])
    short = dataclasses.replace(masked, vector=masked.vector[:-1])
    assert refused(lambda: s.server.receive_masked(short), Reason.WRONG_DIMENSION).participant == p
    floats = dataclasses.replace(masked, vector=masked.vector.astype(np.float64))
    refused(lambda: s.server.receive_masked(floats), Reason.WRONG_DIMENSION)
    s.server.receive_masked(masked)  # the refusals changed nothing: the real one is accepted


def test_a_participant_refuses_to_mask_a_bad_update() -> None:
    s = Session(d=32)
    deliveries = s.to_masking()
    a, b = s.ctx.roster[:2]
    refused(
        lambda: s.parties[a].mask(deliveries[a], np.zeros(31, dtype=np.float32)),
        Reason.WRONG_DIMENSION,
    )
    bad = np.zeros(32, dtype=np.float32)
    bad[7] = np.inf
    assert "coordinate 7" in str(
        refused(lambda: s.parties[b].mask(deliveries[b], bad), Reason.NON_FINITE_UPDATE)
    )


def test_a_malformed_message_is_a_bad_message_refusal() -> None:
    s = Session()
    data = s.parties[s.ctx.roster[0]].advertise().encode()
    for broken in (data[:-1], data + b"\x00", b"XYZ" + data[3:], data[:3] + b"\x02" + data[4:]):
        refused(lambda broken=broken: KeyAdvert.decode(broken), Reason.BAD_MESSAGE)
