"""Shamir t-of-n over 2**521 - 1: a known answer, any t shares, fewer reveal nothing, bad shares."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lensemble.federation.secagg import shamir
from lensemble.federation.secagg.shamir import PRIME


def test_the_textbook_example() -> None:
    # Shamir's scheme as Wikipedia works it: f(x) = 1234 + 166x + 94x^2, t = 3.
    shares = shamir.split(1234, 3, [1, 2, 3, 4, 5, 6], [166, 94])
    assert shares == {1: 1494, 2: 1942, 3: 2578, 4: 3402, 5: 4414, 6: 5614}
    assert shamir.interpolate({2: 1942, 4: 3402, 5: 4414}) == 1234


def test_the_modulus_is_the_mersenne_prime_2_521_minus_1() -> None:
    assert PRIME == 2**521 - 1
    assert pow(3, PRIME - 1, PRIME) == 1  # Fermat witness (the primality is a known result)


@settings(max_examples=40, deadline=None)
@given(
    secret=st.integers(0, 2**256 - 1),
    n=st.integers(1, 12),
    data=st.data(),
)
def test_any_t_shares_reconstruct_the_secret(secret: int, n: int, data: st.DataObject) -> None:
    t = data.draw(st.integers(1, n))
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    coefficients = [rng.randrange(PRIME) for _ in range(t - 1)]
    shares = shamir.split(secret, t, list(range(1, n + 1)), coefficients)
    subset = data.draw(
        st.lists(st.sampled_from(sorted(shares)), min_size=t, max_size=t, unique=True)
    )
    assert shamir.interpolate({x: shares[x] for x in subset}) == secret


def test_fewer_than_t_shares_fit_every_secret_equally() -> None:
    # With t - 1 shares, each candidate secret fixes exactly one polynomial of degree t - 1:
    # the shares say nothing about which candidate is the secret.
    rng = random.Random(1)
    t = 4
    shares = shamir.split(42, t, [1, 2, 3, 4, 5], [rng.randrange(PRIME) for _ in range(t - 1)])
    known = {x: shares[x] for x in (1, 3, 5)}
    for candidate in (0, 42, 2**255, PRIME - 1):
        fitted = {0: candidate, **known}
        assert shamir.interpolate(fitted, at=0) == candidate
        assert all(shamir.interpolate(fitted, at=x) == y for x, y in known.items())


def test_split_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="secret"):
        shamir.split(PRIME, 1, [1], [])
    with pytest.raises(ValueError, match="coefficients"):
        shamir.split(1, 3, [1, 2, 3], [5])
    with pytest.raises(ValueError, match="distinct"):
        shamir.split(1, 2, [1, 1], [5])
    with pytest.raises(ValueError, match="distinct"):
        shamir.split(1, 2, [0, 1], [5])


def test_share_encoding_refuses_what_is_not_a_field_element() -> None:
    assert shamir.decode_share(shamir.encode_share(PRIME - 1)) == PRIME - 1
    assert shamir.decode_share(PRIME.to_bytes(66, "big")) is None
    assert shamir.decode_share(b"\x00" * 65) is None


def test_coefficients_come_from_exactly_the_bytes_given() -> None:
    randomness = bytes(range(256)) * 2
    coefficients = shamir.coefficients_from(randomness[: 3 * shamir.COEFFICIENT_BYTES], 3)
    assert len(coefficients) == 3 and all(0 <= c < PRIME for c in coefficients)
    with pytest.raises(ValueError, match="random bytes"):
        shamir.coefficients_from(randomness[:10], 1)


def _shares(n: int, t: int, secret: int) -> dict[int, int]:
    rng = random.Random(n * 100 + t)
    return shamir.split(
        secret, t, list(range(1, n + 1)), [rng.randrange(PRIME) for _ in range(t - 1)]
    )


def test_a_wrong_share_is_found_and_named_when_spare_shares_exist() -> None:
    shares = _shares(7, 4, 99)
    shares[2] = (shares[2] + 1) % PRIME
    result = shamir.reconstruct_verified(shares, 4, lambda s: s == 99)
    assert result == shamir.Reconstruction(99, (2,))


def test_with_exactly_t_shares_one_wrong_share_cannot_be_recovered_from() -> None:
    shares = {x: y for x, y in _shares(7, 4, 99).items() if x <= 4}
    shares[3] = (shares[3] + 1) % PRIME
    assert shamir.reconstruct_verified(shares, 4, lambda s: s == 99) is None


def test_reconstruction_needs_t_shares_and_ignores_their_order() -> None:
    shares = _shares(6, 3, 7)
    assert (
        shamir.reconstruct_verified(dict(itertools.islice(shares.items(), 2)), 3, lambda s: True)
        is None
    )
    reversed_order = dict(reversed(list(shares.items())))
    assert shamir.reconstruct_verified(
        reversed_order, 3, lambda s: s == 7
    ) == shamir.Reconstruction(7, ())
