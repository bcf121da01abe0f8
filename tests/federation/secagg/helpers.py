"""Shared set-up of the secure-aggregation tests: a session's parties, updates and records."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from lensemble.federation.secagg.context import SessionContext, default_threshold
from lensemble.federation.secagg.fixed_point import FixedPoint
from lensemble.federation.secagg.keys import simulation_seed
from lensemble.federation.secagg.local import DropAfter, LocalResult, run_session


def ids(n: int) -> tuple[str, ...]:
    return tuple(f"org-{i:02d}" for i in range(n))


def context(
    n: int,
    d: int,
    *,
    threshold: int | None = None,
    clip: float = 1.0,
    attempt: int = 0,
    quorum: int = 0,
) -> SessionContext:
    return SessionContext(
        run_id="test-run",
        round=3,
        attempt=attempt,
        group=0,
        roster=ids(n),
        threshold=threshold or default_threshold(n),
        dimension=d,
        codec=FixedPoint.widest(clip, n),
        quorum=quorum,
    )


def identity_keys(roster: tuple[str, ...]) -> dict[str, ec.EllipticCurvePrivateKey]:
    # Deterministic P-256 identity keys, like `lensemble certs init` issues (but reproducible).
    return {p: ec.derive_private_key(10_007 + i, ec.SECP256R1()) for i, p in enumerate(roster)}


def seeds(roster: tuple[str, ...], root_seed: int = 7) -> dict[str, bytes]:
    return {p: simulation_seed(root_seed, p) for p in roster}


def updates(
    roster: tuple[str, ...], d: int, *, scale: float = 0.01, seed: int = 0
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {p: (rng.standard_normal(d) * scale).astype(np.float32) for p in roster}


def plain_sum(
    ctx: SessionContext, ups: Mapping[str, np.ndarray], members: tuple[str, ...]
) -> np.ndarray:
    """The fixed-point sum without masking: what the unmasked sum must equal bit for bit."""
    total = np.zeros(ctx.dimension, dtype=np.uint64)
    for p in members:
        words = np.empty(ctx.dimension, dtype=np.uint64)
        ctx.codec.encode_into(ups[p], words)
        total += words
    return total


@dataclass
class Recorder:
    """Keeps every message in transit, in order: (direction, stage, participant, bytes)."""

    log: list[tuple[str, str, str, bytes]] = field(default_factory=list)

    def down(self, stage: str, who: str, data: bytes) -> bytes:
        self.log.append(("down", stage, who, data))
        return data

    def up(self, stage: str, who: str, data: bytes) -> bytes:
        self.log.append(("up", stage, who, data))
        return data


def run(
    ctx: SessionContext,
    ups: Mapping[str, np.ndarray],
    *,
    drop: Mapping[str, DropAfter] | None = None,
    order_seed: int = 0,
    recorder: Recorder | None = None,
    tamper=None,
    forge=None,
) -> LocalResult:
    if recorder is not None:
        tamper, forge = recorder.down, recorder.up
    return run_session(
        ctx,
        ups,
        seeds(ctx.roster),
        identity_keys(ctx.roster),
        drop=drop,
        order_seed=order_seed,
        tamper=tamper,
        forge=forge,
    )
