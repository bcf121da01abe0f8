"""Removing the masks from the sum: reconstruct, verify, then subtract the keystreams.

For each survivor u the self-mask seed b_u is reconstructed from the revealed shares and checked
against u's signed commitment; PRG(b_u) is subtracted. For each dropped v (in U2, not in U3) the
masking key s_v^SK is reconstructed and checked against v's signed public key; for each survivor
u, the pairwise mask u added for v is subtracted. Shares are taken in roster order, so the result
never depends on arrival order; shares that disagree with a verified reconstruction name their
revealer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from lensemble.federation.secagg import shamir
from lensemble.federation.secagg.context import SessionContext
from lensemble.federation.secagg.keys import commitment, mask_sign, pairwise_key, self_mask_key
from lensemble.federation.secagg.messages import KeyAdvert, UnmaskShares
from lensemble.federation.secagg.primitives import add_keystreams, public_bytes, x25519_private

_SECRET_BYTES = 32


def _as_bytes(secret: int) -> bytes | None:
    return secret.to_bytes(_SECRET_BYTES, "big") if secret < 1 << (8 * _SECRET_BYTES) else None


class Unmasker:
    """Reconstructs secrets from revealed shares and strips their masks from a sum.

    Args:
        context: The session's public parameters.
        adverts: Every U1 member's signed keys and commitment.
        revealed: Every U5 member's revealed shares (already checked for their owners).

    Attributes:
        wrong_revealers: Participants who revealed a share off its owner's polynomial.
    """

    def __init__(
        self,
        context: SessionContext,
        adverts: Mapping[str, KeyAdvert],
        revealed: Mapping[str, UnmaskShares],
    ) -> None:
        self.context = context
        self._adverts = adverts
        self._points = {context.point(p): p for p in revealed}
        self._self_mask = {p: dict(m.self_mask_shares) for p, m in revealed.items()}
        self._keys = {p: dict(m.key_shares) for p, m in revealed.items()}
        self.wrong_revealers: set[str] = set()

    def _reconstruct(
        self, owner: str, shares: Mapping[str, Mapping[str, bytes]], good: Callable[[bytes], bool]
    ) -> bytes:
        points: dict[int, int] = {}
        for x, revealer in sorted(self._points.items()):
            value = shamir.decode_share(shares[revealer][owner])
            assert value is not None  # checked on receipt
            points[x] = value

        def check(secret: int) -> bool:
            raw = _as_bytes(secret)
            return raw is not None and good(raw)

        result = shamir.reconstruct_verified(points, self.context.threshold, check)
        if result is None:
            raise LookupError(owner)
        self.wrong_revealers.update(self._points[x] for x in result.wrong)
        raw = _as_bytes(result.secret)
        assert raw is not None
        return raw

    def self_mask_seed(self, owner: str) -> bytes:
        """b_owner, verified against its commitment.

        Raises:
            LookupError: No subset of t shares gives it (the owner's id is the argument).
        """
        digest = self.context.digest
        expected = self._adverts[owner].commitment
        return self._reconstruct(
            owner, self._self_mask, lambda raw: commitment(raw, digest, owner) == expected
        )

    def masking_key(self, owner: str) -> bytes:
        """s_owner^SK, verified against its advertised public key.

        Raises:
            LookupError: No subset of t shares gives it (the owner's id is the argument).
        """
        expected = self._adverts[owner].masking_key
        return self._reconstruct(
            owner, self._keys, lambda raw: public_bytes(x25519_private(raw)) == expected
        )

    def remove_masks(
        self, total: np.ndarray, survivors: tuple[str, ...], dropped: tuple[str, ...]
    ) -> None:
        """Subtract every survivor's self mask and every survivor's masks for the dropped.

        Args:
            total: The running sum (d + 2 uint64 words), changed in place.
            survivors: U3, sorted.
            dropped: U2 minus U3, sorted.

        Raises:
            LookupError: A secret cannot be reconstructed (its owner's id is the argument).
        """
        digest = self.context.digest
        streams = [
            (self_mask_key(self.self_mask_seed(owner), digest, owner), -1) for owner in survivors
        ]
        for owner in dropped:
            private = x25519_private(self.masking_key(owner))
            for survivor in survivors:
                key = pairwise_key(
                    private, self._adverts[survivor].masking_key, digest, owner, survivor
                )
                assert key is not None  # both keys were checked when shares were made
                streams.append((key, -mask_sign(survivor, owner)))
        add_keystreams(total, streams)
