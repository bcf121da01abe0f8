"""The round state machine (docs/concepts.md#the-round).

    OPEN -> COLLECTING -> AGGREGATING -> COMMITTING -> CLOSED
    (any state before CLOSED) -> ABORTED

COMMITTING is the only state in which global state changes. ABORTED leaves the global model and
the outer momentum untouched; the coordinator then retries the round (a new attempt) or stops.
"""

from __future__ import annotations

from enum import StrEnum

from lensemble.errors import RoundError


class RoundState(StrEnum):
    """States of one round attempt."""

    OPEN = "open"
    COLLECTING = "collecting"
    AGGREGATING = "aggregating"
    COMMITTING = "committing"
    CLOSED = "closed"
    ABORTED = "aborted"


_NEXT: dict[RoundState, frozenset[RoundState]] = {
    RoundState.OPEN: frozenset({RoundState.COLLECTING, RoundState.ABORTED}),
    RoundState.COLLECTING: frozenset({RoundState.AGGREGATING, RoundState.ABORTED}),
    RoundState.AGGREGATING: frozenset({RoundState.COMMITTING, RoundState.ABORTED}),
    RoundState.COMMITTING: frozenset({RoundState.CLOSED, RoundState.ABORTED}),
    RoundState.CLOSED: frozenset(),
    RoundState.ABORTED: frozenset(),
}


class RoundMachine:
    """Tracks one round attempt's state and refuses illegal transitions.

    Args:
        round_index: The round.
        attempt: The attempt (0-based).
    """

    def __init__(self, round_index: int, attempt: int) -> None:
        self.round_index = round_index
        self.attempt = attempt
        self.state = RoundState.OPEN
        self.history = [RoundState.OPEN]

    def advance(self, target: RoundState) -> None:
        """Move to ``target``.

        Raises:
            RoundError: ``target`` is not reachable from the current state.
        """
        if target not in _NEXT[self.state]:
            raise RoundError(
                f"round {self.round_index} cannot go from {self.state} to {target};",
                remediation="this is a bug in the coordinator, please report it.",
            )
        self.state = target
        self.history.append(target)

    @property
    def done(self) -> bool:
        """True once CLOSED or ABORTED."""
        return self.state in (RoundState.CLOSED, RoundState.ABORTED)
