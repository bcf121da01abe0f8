"""Shamir t-of-n secret sharing over the prime field of the Mersenne prime 2**521 - 1.

A secret of up to 64 bytes (a 32-byte seed or X25519 private key) is one field element, so no
chunking is needed. Shares are evaluated at x = 1..n (a participant's 1-based position in the
session's roster), never at 0. The coefficients come from the caller (the PRG's keystream under a
derived key, so reruns give the same shares), each reduced from 66 + 16 bytes, a bias below
2**-128. Reconstruction is Lagrange interpolation at 0; :func:`reconstruct_verified` checks the
result against the owner's public commitment and, when the first t shares fail it, searches
subsets for a consistent one and names the shares that disagree with it. Source: A. Shamir,
"How to share a secret", CACM 22(11), 1979.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

#: The field's modulus, the Mersenne prime 2**521 - 1.
PRIME = (1 << 521) - 1
#: Bytes of one encoded share value (big-endian, below PRIME).
SHARE_BYTES = 66
#: Bytes of randomness reduced to one coefficient (66 + 16: bias below 2**-128).
COEFFICIENT_BYTES = SHARE_BYTES + 16
#: Subsets :func:`reconstruct_verified` tries before it gives up.
MAX_SUBSETS = 4096


def coefficients_from(randomness: bytes, count: int) -> list[int]:
    """``count`` field elements from ``count * COEFFICIENT_BYTES`` random bytes."""
    if len(randomness) != count * COEFFICIENT_BYTES:
        raise ValueError(f"need {count * COEFFICIENT_BYTES} random bytes, got {len(randomness)}")
    step = COEFFICIENT_BYTES
    return [
        int.from_bytes(randomness[i * step : (i + 1) * step], "big") % PRIME for i in range(count)
    ]


def evaluate(coefficients: Sequence[int], x: int) -> int:
    """The polynomial ``c0 + c1 x + ... `` at ``x``, mod :data:`PRIME` (Horner's rule)."""
    value = 0
    for c in reversed(coefficients):
        value = (value * x + c) % PRIME
    return value


def split(
    secret: int, threshold: int, xs: Sequence[int], coefficients: Sequence[int]
) -> dict[int, int]:
    """Shares of ``secret``: any ``threshold`` of them reconstruct it, fewer reveal nothing.

    Args:
        secret: The secret, in [0, PRIME).
        threshold: t, at least 1.
        xs: Distinct evaluation points in [1, PRIME).
        coefficients: The ``threshold - 1`` random coefficients of degree 1 and up.

    Returns:
        ``{x: share}`` for every x in ``xs``.

    Raises:
        ValueError: On a secret, point or coefficient count out of range.
    """
    if not 0 <= secret < PRIME:
        raise ValueError("the secret must lie in [0, PRIME)")
    if threshold < 1 or len(coefficients) != threshold - 1:
        raise ValueError(f"a threshold of {threshold} needs {threshold - 1} coefficients")
    if len(set(xs)) != len(xs) or any(not 0 < x < PRIME for x in xs):
        raise ValueError("evaluation points must be distinct and in [1, PRIME)")
    polynomial = [secret, *coefficients]
    return {x: evaluate(polynomial, x) for x in xs}


def interpolate(shares: Mapping[int, int], at: int = 0) -> int:
    """The value at ``at`` of the polynomial through ``shares`` (Lagrange interpolation).

    Args:
        shares: ``{x: y}`` with distinct x; their count is the polynomial's degree plus one.
        at: Where to evaluate (0 gives the secret).
    """
    total = 0
    points = list(shares.items())
    for i, (xi, yi) in enumerate(points):
        numerator, denominator = 1, 1
        for j, (xj, _) in enumerate(points):
            if i != j:
                numerator = numerator * (at - xj) % PRIME
                denominator = denominator * (xi - xj) % PRIME
        total = (total + yi * numerator * pow(denominator, -1, PRIME)) % PRIME
    return total


def encode_share(value: int) -> bytes:
    """A share value as :data:`SHARE_BYTES` big-endian bytes."""
    return value.to_bytes(SHARE_BYTES, "big")


def decode_share(raw: bytes) -> int | None:
    """A share value from :func:`encode_share`, or None when it is not a field element."""
    if len(raw) != SHARE_BYTES:
        return None
    value = int.from_bytes(raw, "big")
    return value if value < PRIME else None


@dataclass(frozen=True)
class Reconstruction:
    """A verified secret and the shares that disagree with it.

    Attributes:
        secret: The reconstructed secret, which passed the caller's check.
        wrong: The x of every share not on the polynomial that gave it, sorted.
    """

    secret: int
    wrong: tuple[int, ...]


def reconstruct_verified(
    shares: Mapping[int, int], threshold: int, check: Callable[[int], bool]
) -> Reconstruction | None:
    """The secret that ``check`` accepts, from ``threshold`` of ``shares``, or None.

    Subsets are tried in a fixed order (first the ``threshold`` smallest x, then the next
    combinations) up to :data:`MAX_SUBSETS`, so the result never depends on arrival order.

    Args:
        shares: ``{x: y}`` as revealed.
        threshold: t.
        check: True for the right secret (e.g. its public key or commitment matches).

    Returns:
        The secret and the shares that disagree with it, or None when fewer than
        ``threshold`` shares exist or no subset tried gives a secret that passes ``check``.
    """
    xs = sorted(shares)
    if len(xs) < threshold:
        return None
    for subset in itertools.islice(itertools.combinations(xs, threshold), MAX_SUBSETS):
        chosen = {x: shares[x] for x in subset}
        secret = interpolate(chosen)
        if check(secret):
            wrong = tuple(
                x for x in xs if x not in chosen and interpolate(chosen, at=x) != shares[x]
            )
            return Reconstruction(secret, wrong)
    return None
