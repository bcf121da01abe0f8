"""One session's public parameters, and the digest that binds every key, signature and message.

A session is one attempt of one round (of one group, when updates are aggregated by groups):
``run_id``, ``round``, ``attempt`` and ``group`` name it; ``roster`` lists who may take part;
``present`` the attempt's present set when it is not every configured participant (the groups
were drawn from it: :mod:`lensemble.federation.secagg.present`); ``threshold`` is Shamir's t;
``min_survivors`` is ``max(quorum, 3, t)``, the fewest inputs a sum
may have; ``dimension`` is d and ``codec`` the fixed-point encoding. :meth:`SessionContext.digest`
is SHA-256 of all of it: it salts every key derivation, is signed with every key and survivor
set, and heads every message, so nothing from one session (or one set of parameters) is ever
accepted in another.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from lensemble.errors import ConfigError, ConfigProblem
from lensemble.federation.secagg.fixed_point import FixedPoint
from lensemble.federation.secagg.wire import MAX_ID_BYTES, MAX_PARTICIPANTS, Writer

THRESHOLD_FIELD = "federation.masking.threshold"
QUORUM_FIELD = "federation.quorum"
#: Fewest inputs a secure sum may have: with two, each learns the other's update.
MIN_INPUTS = 3
#: Largest d accepted (2**33 AES blocks of keystream per key: far
#: from wrapping the 128-bit counter).
MAX_DIMENSION = 2**34


def default_threshold(participants: int) -> int:
    """Shamir's t = floor(2n/3) + 1, the malicious-server setting of Bonawitz et al. (CCS'17)."""
    return 2 * participants // 3 + 1


@dataclass(frozen=True)
class SessionContext:
    """The public parameters of one session.

    Attributes:
        run_id: The run's name (``run.name``) or another stable run identifier.
        round: The round index (0-based).
        attempt: The attempt of that round (0-based).
        group: The group index when aggregating by groups, else 0.
        roster: The invited participants' ids, sorted, unique; a participant's Shamir point is
            its 1-based position here.
        threshold: Shamir's t: shares needed to reconstruct a secret.
        dimension: d, the number of float values of one update.
        codec: The fixed-point encoding.
        quorum: The round's quorum (``federation.quorum`` resolved).
        present: The attempt's present set the groups were drawn from, sorted, unique; empty
            when they were drawn from every configured participant (the digest is then the one
            a context without a present set always had).
        every_signs: Every survivor must sign the survivor set before anything is revealed
            (not only t of them): set with several groups, whose retries regroup updates with
            other partners (docs/security.md, *one sum per update*). In the digest only when
            set, as ``present``.
    """

    run_id: str
    round: int
    attempt: int
    group: int
    roster: tuple[str, ...]
    threshold: int
    dimension: int
    codec: FixedPoint
    quorum: int = 0
    present: tuple[str, ...] = ()
    every_signs: bool = False
    _index: dict[str, int] = field(init=False, repr=False, compare=False)
    _digest: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = len(self.roster)
        if list(self.roster) != sorted(set(self.roster)):
            raise ValueError("the roster must be sorted participant ids without duplicates")
        if list(self.present) != sorted(set(self.present)):
            raise ValueError("the present set must be sorted participant ids without duplicates")
        if self.present and not set(self.roster) <= set(self.present):
            raise ValueError("the roster must be drawn from the present set")
        if any(not p or len(p.encode()) > MAX_ID_BYTES or not p.isprintable() for p in self.roster):
            raise ValueError(f"participant ids must be printable and at most {MAX_ID_BYTES} bytes")
        if not MIN_INPUTS <= n <= MAX_PARTICIPANTS:
            raise ConfigError(
                [
                    ConfigProblem(
                        "federation.participants",
                        f"masking needs {MIN_INPUTS} to "
                        f"{MAX_PARTICIPANTS} participants per session, not {n};",
                    )
                ]
            )
        if not n // 2 < self.threshold <= n:
            raise ConfigError(
                [
                    ConfigProblem(
                        THRESHOLD_FIELD,
                        f"{self.threshold} must be above half of the "
                        f"{n} participants and at most {n} (default {default_threshold(n)});",
                    )
                ]
            )
        if self.min_survivors > n:
            raise ConfigError(
                [
                    ConfigProblem(
                        QUORUM_FIELD,
                        f"a quorum of {self.quorum} exceeds the {n} "
                        "participants of a masking session, so no round could commit;",
                    )
                ]
            )
        if not 1 <= self.dimension <= MAX_DIMENSION:
            raise ValueError(f"the dimension must be in [1, {MAX_DIMENSION}]")
        self.codec.check_headroom(n)
        object.__setattr__(self, "_index", {p: i + 1 for i, p in enumerate(self.roster)})
        object.__setattr__(self, "_digest", self._encode_digest())

    @property
    def min_survivors(self) -> int:
        """``max(quorum, 3, t)``: the fewest inputs the sum may have."""
        return max(self.quorum, MIN_INPUTS, self.threshold)

    @property
    def words(self) -> int:
        """Words of a masked vector: d values, the clipped count, and a 1 (the input count)."""
        return self.dimension + 2

    def point(self, participant: str) -> int:
        """The participant's Shamir evaluation point (1-based roster position).

        Raises:
            KeyError: The participant is not on the roster.
        """
        return self._index[participant]

    def __contains__(self, participant: object) -> bool:
        return participant in self._index

    @property
    def digest(self) -> bytes:
        """SHA-256 of the canonical encoding of every field (32 bytes)."""
        return self._digest

    def _encode_digest(self) -> bytes:
        out = (
            Writer(0)
            .text(self.run_id)
            .u64(self.round)
            .u64(self.attempt)
            .u64(self.group)
            .u32(self.threshold)
            .u32(self.quorum)
            .u64(self.dimension)
            .text(repr(float(self.codec.clip)))
            .u8(self.codec.fractional_bits)
            .u32(len(self.roster))
        )
        for participant in self.roster:
            out.text(participant)
        if self.present:
            # Appended only when set, so every digest without one is unchanged; the roster's
            # count prefix keeps the encoding unambiguous.
            out.u8(1).u32(len(self.present))
            for participant in self.present:
                out.text(participant)
        if self.every_signs:
            out.u8(2)  # a tag after the optional present set: each encoding stays unambiguous
        return hashlib.sha256(out.finish()).digest()
