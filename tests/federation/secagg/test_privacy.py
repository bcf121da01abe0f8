"""What the coordinator receives, plus t - 1 colluding participants, hides each update.

The coordinator's view here is every message it received or sent in a session (recorded in
transit) and the seeds, hence every secret, of t - 1 colluding participants. From it the tests
reconstruct all that is reconstructable and strip every mask they can from one honest
participant's masked vector; the remainder still differs from that participant's encoded
update in every coordinate. The same attack with one more colluder (t shares) recovers the
update exactly, which shows that the threshold, and nothing weaker in the attack, is what stops
it. A second test takes a coordinator that keeps a masked vector and then declares its sender
dropped, to obtain its masking key: the self mask still hides the update, because no honest
participant reveals both secrets of one peer.
"""

from __future__ import annotations

import numpy as np

from lensemble.federation.secagg import shamir
from lensemble.federation.secagg.context import SessionContext
from lensemble.federation.secagg.keys import (
    ParticipantSecrets,
    commitment,
    mask_sign,
    pairwise_key,
    self_mask_key,
    share_associated_data,
    share_encryption_key,
)
from lensemble.federation.secagg.local import DropAfter
from lensemble.federation.secagg.messages import (
    EncryptedShares,
    KeyAdvert,
    MaskedInput,
    ShareDelivery,
    UnmaskShares,
)
from lensemble.federation.secagg.participant import ParticipantSession
from lensemble.federation.secagg.primitives import (
    add_keystream,
    agree,
    open_sealed,
    public_bytes,
    x25519_private,
)
from tests.federation.secagg.helpers import Recorder, context, identity_keys, run, seeds, updates


class View:
    """The coordinator's record of one session."""

    def __init__(self, ctx: SessionContext, recorder: Recorder) -> None:
        self.ctx = ctx
        self.digest = ctx.digest
        ups = [
            (stage, who, data) for direction, stage, who, data in recorder.log if direction == "up"
        ]
        self.adverts = {w: KeyAdvert.decode(d) for s, w, d in ups if s == "advertise"}
        self.shares = {w: EncryptedShares.decode(d) for s, w, d in ups if s == "share"}
        self.masked = {w: MaskedInput.decode(d).vector.copy() for s, w, d in ups if s == "mask"}
        self.revealed = {w: UnmaskShares.decode(d) for s, w, d in ups if s == "unmask"}

    def share_held_by(self, colluder: str, owner: str) -> tuple[int, int]:
        """The (b, s) shares of ``owner`` that ``colluder`` decrypted: what a colluder hands over."""
        secrets = ParticipantSecrets.derive(seeds(self.ctx.roster)[colluder], self.digest, colluder)
        shared = agree(secrets.encryption_key, self.adverts[owner].encryption_key)
        assert shared is not None
        key = share_encryption_key(shared, self.digest, owner, colluder)
        ciphertext = dict(self.shares[owner].ciphertexts)[colluder]
        plaintext = open_sealed(
            key, ciphertext, share_associated_data(self.digest, owner, colluder)
        )
        assert plaintext is not None
        half = shamir.SHARE_BYTES
        return int.from_bytes(plaintext[:half], "big"), int.from_bytes(plaintext[half:], "big")

    def revealed_self_mask_seed(self, owner: str) -> bytes:
        """b_owner as the coordinator reconstructs it from the survivors' revealed shares."""
        points = {
            self.ctx.point(p): int.from_bytes(dict(m.self_mask_shares)[owner], "big")
            for p, m in self.revealed.items()
        }
        return shamir.interpolate(dict(sorted(points.items())[: self.ctx.threshold])).to_bytes(
            32, "big"
        )

    def strip_pairwise(
        self,
        vector: np.ndarray,
        owner: str,
        peer: str,
        owner_or_peer_key: bytes,
        *,
        held_by_peer: bool,
    ) -> None:
        """Subtract the mask ``owner`` added for ``peer``, knowing one of their masking keys."""
        private = x25519_private(owner_or_peer_key)
        other = owner if held_by_peer else peer
        key = pairwise_key(private, self.adverts[other].masking_key, self.digest, owner, peer)
        assert key is not None
        add_keystream(vector, key, sign=-mask_sign(owner, peer))


def encoded(ctx: SessionContext, update: np.ndarray) -> np.ndarray:
    words = np.empty(ctx.dimension, dtype=np.uint64)
    ctx.codec.encode_into(update, words)
    return words


def masking_key_of(ctx: SessionContext, participant: str) -> bytes:
    return ParticipantSecrets.derive(
        seeds(ctx.roster)[participant], ctx.digest, participant
    ).masking_key.private_bytes_raw()


def attack_survivor(view: View, target: str, colluders: tuple[str, ...]) -> tuple[np.ndarray, bool]:
    """Strip every mask the view and the colluders allow from ``target``'s masked vector.

    Returns the remainder (d words) and whether ``target``'s masking key was reconstructed.
    """
    ctx = view.ctx
    rest = view.masked[target].copy()
    b = view.revealed_self_mask_seed(target)  # revealed legitimately: target is a survivor
    assert commitment(b, view.digest, target) == view.adverts[target].commitment
    add_keystream(rest, self_mask_key(b, view.digest, target), sign=-1)
    for c in colluders:  # each colluder knows its own masking key
        view.strip_pairwise(rest, target, c, masking_key_of(ctx, c), held_by_peer=True)
    points = {ctx.point(c): view.share_held_by(c, target)[1] for c in colluders}
    guess = shamir.interpolate(points)
    recovered = (
        guess < 2**256
        and public_bytes(x25519_private(guess.to_bytes(32, "big")))
        == view.adverts[target].masking_key
    )
    if recovered:
        for peer in view.shares:
            if peer not in (target, *colluders):
                view.strip_pairwise(
                    rest, target, peer, guess.to_bytes(32, "big"), held_by_peer=False
                )
    return rest[: ctx.dimension], recovered


def test_t_minus_1_colluders_and_the_coordinator_learn_no_survivor_update() -> None:
    ctx = context(8, 4000)  # t = 6
    ups = updates(ctx.roster, 4000)
    recorder = Recorder()
    run(ctx, ups, recorder=recorder)
    view = View(ctx, recorder)
    target = ctx.roster[3]
    others = tuple(p for p in ctx.roster if p != target)
    truth = encoded(ctx, ups[target])

    rest, recovered = attack_survivor(view, target, others[: ctx.threshold - 1])
    assert not recovered
    assert np.count_nonzero(rest == truth) == 0  # still masked in every coordinate

    rest, recovered = attack_survivor(view, target, others[: ctx.threshold])
    assert recovered
    assert np.array_equal(rest, truth)  # one more colluder, and the attack succeeds


def test_a_coordinator_that_keeps_a_vector_and_declares_its_sender_dropped_learns_nothing() -> None:
    ctx = context(8, 4000)
    ups = updates(ctx.roster, 4000)
    victim = ctx.roster[2]
    recorder = Recorder()
    result = run(ctx, ups, recorder=recorder, drop={victim: DropAfter.SHARE})
    assert result.sum.dropped == (victim,)
    view = View(ctx, recorder)
    # The victim's masked vector, as it would have sent it (its delivery, from the recorded
    # shares): the coordinator kept it and still declared the victim dropped.
    keys = identity_keys(ctx.roster)
    session = ParticipantSession(
        ctx,
        victim,
        seeds(ctx.roster)[victim],
        keys[victim],
        {p: k.public_key() for p, k in keys.items()},
    )
    session.advertise()
    roster = next(
        d for direction, s, w, d in recorder.log if (direction, s, w) == ("down", "share", victim)
    )
    from lensemble.federation.secagg.messages import KeyRoster

    session.share_keys(KeyRoster.decode(roster))
    delivery = ShareDelivery(
        ctx.digest,
        victim,
        tuple(
            (u, dict(m.ciphertexts)[victim]) for u, m in sorted(view.shares.items()) if u != victim
        ),
    )
    kept = session.mask(delivery, ups[victim]).vector.copy()

    # The dropped victim's masking key is revealed legitimately: strip every pairwise mask.
    points = {
        ctx.point(p): int.from_bytes(dict(m.key_shares)[victim], "big")
        for p, m in view.revealed.items()
    }
    s_victim = shamir.interpolate(dict(sorted(points.items())[: ctx.threshold])).to_bytes(32, "big")
    assert public_bytes(x25519_private(s_victim)) == view.adverts[victim].masking_key
    for peer in view.shares:
        if peer != victim:
            view.strip_pairwise(kept, victim, peer, s_victim, held_by_peer=False)
    truth = encoded(ctx, ups[victim])
    # Its self mask stays: t - 1 colluders' shares of b do not give it, and honest
    # participants revealed no share of b for a dropped peer.
    assert all(
        not m.self_mask_shares or victim not in dict(m.self_mask_shares)
        for m in view.revealed.values()
    )
    colluders = tuple(p for p in ctx.roster if p != victim)[: ctx.threshold - 1]
    b_guess = shamir.interpolate(
        {ctx.point(c): view.share_held_by(c, victim)[0] for c in colluders}
    )
    assert (
        b_guess >= 2**256
        or commitment(b_guess.to_bytes(32, "big"), ctx.digest, victim)
        != view.adverts[victim].commitment
    )
    assert np.count_nonzero(kept[: ctx.dimension] == truth) == 0
    # With t shares of b (which honest participants never reveal for a dropped peer) it falls.
    colluders = tuple(p for p in ctx.roster if p != victim)[: ctx.threshold]
    b = shamir.interpolate(
        {ctx.point(c): view.share_held_by(c, victim)[0] for c in colluders}
    ).to_bytes(32, "big")
    add_keystream(kept, self_mask_key(b, ctx.digest, victim), sign=-1)
    assert np.array_equal(kept[: ctx.dimension], truth)
