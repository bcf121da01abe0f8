"""Capped exponential backoff with jitter, for reconnecting to the coordinator.

Attempt ``n`` (0-based) waits a random time in ``[d/2, d]`` with ``d = min(cap, base * 2**n)``
("equal jitter"): participants that lost the coordinator together do not retry in lockstep, and
no wait is ever shorter than half the nominal delay.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Delays (seconds) between reconnection attempts.

    Args:
        cap_s: Longest delay (``network.connect_backoff_max_s``), seconds.
        base_s: First nominal delay, seconds.
        rng: Random source for the jitter (seeded in tests).
    """

    cap_s: float
    base_s: float = 0.2
    rng: random.Random = field(default_factory=random.Random)
    attempt: int = 0

    def nominal(self, attempt: int) -> float:
        """The capped delay before jitter for ``attempt`` (seconds)."""
        return min(self.cap_s, self.base_s * 2.0 ** min(attempt, 62))

    def next_delay(self) -> float:
        """The next delay (seconds), and count the attempt."""
        nominal = self.nominal(self.attempt)
        self.attempt += 1
        return nominal / 2 + self.rng.uniform(0.0, nominal / 2)

    def reset(self) -> None:
        """Start over after a success."""
        self.attempt = 0
