"""Fixed point in Z_2^64: exact, order-free sums of clipped, rounded updates.

A value x becomes ``rint(clip(x, -clip, clip) * 2**f)`` (round half to even), an int64 stored
as its uint64 two's complement, so adding words mod 2**64 adds the integers exactly as long as no
sum leaves int64. With ``n`` participants that holds when ``n * ceil(clip * 2**f) <= 2**63 - 1``:
:meth:`FixedPoint.check_headroom` refuses anything else, naming the config field, and
:meth:`FixedPoint.widest` picks the largest ``f`` that fits. The bound ``clip`` is public; every
coordinate beyond it is clipped and counted (the count travels masked with the update, so the
coordinator learns only the round's total). Decoding divides in float64 and rounds once to
float32; its error against a float64 mean is measured in ``docs/performance.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lensemble.errors import ConfigError, ConfigProblem

#: The largest sum of n words that stays an int64.
WORD_LIMIT = 2**63 - 1
#: Elements converted per step, so conversion needs one block of float64 scratch, not d.
_BLOCK = 1 << 16
CLIP_FIELD = "federation.masking.clip"
BITS_FIELD = "federation.masking.fractional_bits"


@dataclass(frozen=True)
class FixedPoint:
    """The public encoding of one session: clip bound and fractional bits.

    Attributes:
        clip: Every coordinate is clipped to [-clip, clip] (unitless, > 0).
        fractional_bits: f: a coordinate is stored as an integer number of 2**-f (0..62).
    """

    clip: float
    fractional_bits: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise ConfigError([ConfigProblem(CLIP_FIELD, f"{self.clip} is not a positive number;")])
        if not 0 <= self.fractional_bits <= 62:
            raise ConfigError(
                [ConfigProblem(BITS_FIELD, f"{self.fractional_bits} is outside [0, 62];")]
            )
        if self.bound > WORD_LIMIT:
            self._too_wide(1)

    @property
    def scale(self) -> float:
        """2**f, the value of one unit is its inverse."""
        return float(2**self.fractional_bits)

    @property
    def bound(self) -> int:
        """``ceil(clip * 2**f)``: the largest magnitude one encoded coordinate can have."""
        return math.ceil(self.clip * self.scale)

    def check_headroom(self, participants: int) -> None:
        """Refuse an encoding whose sum over ``participants`` could overflow int64.

        Raises:
            ConfigError: ``participants * ceil(clip * 2**f) > 2**63 - 1``, naming both fields
                and the largest fractional_bits that would fit.
        """
        if participants * self.bound > WORD_LIMIT:
            self._too_wide(participants)

    def _too_wide(self, participants: int) -> None:
        fits = widest_bits(self.clip, participants)
        hint = f"at most {fits}" if fits is not None else "a smaller clip"
        raise ConfigError(
            [
                ConfigProblem(
                    BITS_FIELD,
                    f"{participants} participants times clip {self.clip} times 2**"
                    f"{self.fractional_bits} exceeds 2**63 - 1, so the masked sum could "
                    f"overflow; use {hint} (or lower {CLIP_FIELD}).",
                )
            ]
        )

    @classmethod
    def widest(cls, clip: float, participants: int) -> FixedPoint:
        """The encoding with the most fractional bits whose sum over ``participants`` fits.

        Raises:
            ConfigError: Even 0 fractional bits overflow (``clip`` is too large).
        """
        bits = widest_bits(clip, participants)
        if bits is None:
            FixedPoint(clip, 0).check_headroom(participants)
        return cls(clip, bits if bits is not None else 0)

    def encode_into(self, values: np.ndarray, out: np.ndarray) -> int:
        """Encode ``values`` into ``out``; return how many coordinates were clipped.

        Args:
            values: 1-D float32 or float64 array of d values.
            out: 1-D uint64 array of d words, overwritten.

        Returns:
            The count of coordinates with ``|x| > clip``.

        Raises:
            ValueError: A value is NaN or infinite (its index is named).
        """
        clipped = 0
        scaled = np.empty(min(_BLOCK, len(values)), dtype=np.float64)
        signed = out.view(np.int64)
        for start in range(0, len(values), _BLOCK):
            block = np.asarray(values[start : start + _BLOCK], dtype=np.float64)
            # One sum finds a NaN or an infinity (float64 sums of float32 values cannot
            # overflow); only then is the first one looked for.
            if not math.isfinite(float(block.sum())):
                bad = start + int(np.flatnonzero(~np.isfinite(block))[0])
                raise ValueError(f"coordinate {bad} of the update is not finite")
            clipped += int(np.count_nonzero(block > self.clip))
            clipped += int(np.count_nonzero(block < -self.clip))
            buffer = scaled[: len(block)]
            np.clip(block, -self.clip, self.clip, out=buffer)
            np.multiply(buffer, self.scale, out=buffer)
            np.rint(buffer, out=buffer)
            np.copyto(signed[start : start + len(block)], buffer, casting="unsafe")
        return clipped

    def decode_sum(self, total: np.ndarray) -> np.ndarray:
        """The float64 sum that the uint64 words ``total`` encode (one new d-value array)."""
        decoded = total.view(np.int64).astype(np.float64)
        decoded /= self.scale  # in place: a second d-value temporary would be the round's peak
        return decoded

    def decode_mean(self, total: np.ndarray, count: int) -> np.ndarray:
        """The float32 mean of ``count`` updates whose encoded sum is ``total``.

        Divides in float64 and rounds once to float32.
        """
        return (self.decode_sum(total) / count).astype(np.float32)


def widest_bits(clip: float, participants: int) -> int | None:
    """The largest f in [0, 62] with ``participants * ceil(clip * 2**f) <= 2**63 - 1``, or None."""
    for bits in range(62, -1, -1):
        if participants * math.ceil(clip * 2.0**bits) <= WORD_LIMIT:
            return bits
    return None
