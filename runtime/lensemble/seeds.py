"""Deterministic seed derivation: every random stream in a run descends from ``run.root_seed``.

``derive(root_seed, label)`` is SHA-256 of ``"lensemble-seed-v1:{root_seed}:{label}"``, first 8
bytes big-endian, masked to 63 bits. Labels name the stream, e.g. ``"data:alpine"``,
``"batches:alpine:round:3"`` or ``"model-init"``. The derivation never depends on process,
transport or arrival order, so a participant computes the same seeds in the simulation and as a
separate process.
"""

from __future__ import annotations

import hashlib

SEED_DERIVATION = "sha256-v1"


def derive(root_seed: int, label: str) -> int:
    """A 63-bit seed for one named random stream.

    Args:
        root_seed: ``run.root_seed``.
        label: Name of the stream; distinct labels give independent seeds.

    Returns:
        An integer in ``[0, 2**63)``.
    """
    digest = hashlib.sha256(f"lensemble-seed-v1:{root_seed}:{label}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)
