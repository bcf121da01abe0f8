"""A session's parameters: refused by config field when no round could commit; identity keys."""

from __future__ import annotations

import dataclasses

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from lensemble.errors import ConfigError
from lensemble.federation.secagg import identity
from lensemble.federation.secagg.context import SessionContext, default_threshold
from lensemble.federation.secagg.fixed_point import FixedPoint
from lensemble.federation.secagg.local import run_session
from tests.federation.secagg.helpers import context, ids, plain_sum, seeds, updates


@pytest.mark.parametrize(("n", "t"), [(3, 3), (4, 3), (5, 4), (8, 6), (16, 11), (32, 22)])
def test_the_default_threshold_is_two_thirds_plus_one(n: int, t: int) -> None:
    assert default_threshold(n) == t


def test_parameters_that_no_round_could_commit_under_are_refused_by_field() -> None:
    with pytest.raises(ConfigError, match="federation.masking.threshold"):
        context(6, 4, threshold=3)  # not above half
    with pytest.raises(ConfigError, match="federation.masking.threshold"):
        context(6, 4, threshold=7)
    with pytest.raises(ConfigError, match="federation.quorum"):
        context(6, 4, quorum=7)
    with pytest.raises(ConfigError, match="federation.participants"):
        context(2, 4, threshold=2)
    with pytest.raises(ConfigError, match="federation.masking.fractional_bits"):
        SessionContext("r", 0, 0, 0, ids(8), 6, 4, FixedPoint.widest(1.0, 4))
    with pytest.raises(ValueError, match="sorted"):
        SessionContext("r", 0, 0, 0, ("b", "a", "c"), 3, 4, FixedPoint.widest(1.0, 3))


def test_every_parameter_changes_the_digest() -> None:
    base = context(5, 10)
    variants = [
        dataclasses.replace(base, run_id="other"),
        dataclasses.replace(base, round=4),
        dataclasses.replace(base, attempt=1),
        dataclasses.replace(base, group=1),
        dataclasses.replace(base, threshold=5),
        dataclasses.replace(base, dimension=11),
        dataclasses.replace(base, codec=FixedPoint(1.0, 20)),
        dataclasses.replace(base, quorum=5),
        dataclasses.replace(base, roster=(*base.roster[:-1], "zzz")),
    ]
    assert len({base.digest, *(v.digest for v in variants)}) == len(variants) + 1


def test_ed25519_identities_work_and_rsa_is_refused() -> None:
    ctx = context(4, 20)
    keys = {
        p: ed25519.Ed25519PrivateKey.from_private_bytes(bytes([i + 1]) * 32)
        for i, p in enumerate(ctx.roster)
    }
    ups = updates(ctx.roster, 20)
    result = run_session(ctx, ups, seeds(ctx.roster), keys)
    assert result.sum.total.tobytes() == plain_sum(ctx, ups, ctx.roster).tobytes()
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    with pytest.raises(TypeError, match="EC \\(P-256\\) or Ed25519"):
        identity.sign(rsa_key, b"x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="EC \\(P-256\\) or Ed25519"):
        identity.check_key_type(rsa_key)  # type: ignore[arg-type]
    assert not identity.verify(rsa_key.public_key(), b"sig", b"x")  # type: ignore[arg-type]


def test_ecdsa_signatures_are_deterministic_and_checked() -> None:
    key = ec.derive_private_key(5, ec.SECP256R1())
    assert identity.sign(key, b"m") == identity.sign(key, b"m")
    assert identity.verify(key.public_key(), identity.sign(key, b"m"), b"m")
    assert not identity.verify(key.public_key(), identity.sign(key, b"m"), b"n")
