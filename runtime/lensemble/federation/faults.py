"""Fault plans for the in-process transport: drop, delay, reorder, duplicate, corrupt.

A plan is a comma-separated list (``--faults`` on ``lensemble simulate``)::

    drop:alpine@3          alpine submits nothing in round 3 (every attempt)
    drop:alpine@3.0        ... only in attempt 0 of round 3
    delay:coastal@5        coastal's submission arrives after round 5's deadline (a late message)
    delay:coastal@5=12.5   ... arrives 12.5 virtual seconds after the round opened
    reorder@2              submissions of round 2 arrive in reverse order
    duplicate:delta@4      delta's submission of round 4 arrives twice
    corrupt:delta@4        delta's submission of round 4 arrives with damaged bytes

Rounds are 0-based. Faults change which participants contribute; they never change how the
coordinator reduces (docs/concepts.md#deterministic-aggregation).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lensemble.errors import UsageError

_FAULT = re.compile(
    r"^(?P<kind>drop|delay|late|duplicate|corrupt|reorder)"
    r"(?::(?P<pid>[a-z0-9]([-a-z0-9]*[a-z0-9])?))?"
    r"@(?P<round>\d+)(?:\.(?P<attempt>\d+))?(?:=(?P<seconds>\d+(?:\.\d+)?))?$"
)
_NEEDS_PARTICIPANT = {"drop", "delay", "late", "duplicate", "corrupt"}


@dataclass(frozen=True)
class Fault:
    """One injected fault.

    Attributes:
        kind: ``drop``, ``delay`` (``late`` is an alias), ``reorder``, ``duplicate``, ``corrupt``.
        participant: Target participant (None for ``reorder``).
        round_index: Round it applies to.
        attempt: Attempt it applies to (None: every attempt).
        seconds: For ``delay``: virtual seconds after opening (None: past the deadline).
    """

    kind: str
    participant: str | None
    round_index: int
    attempt: int | None = None
    seconds: float | None = None

    def applies(self, round_index: int, attempt: int) -> bool:
        """True when the fault targets this round attempt."""
        return self.round_index == round_index and self.attempt in (None, attempt)


def damage(payload: bytes) -> bytes:
    """``payload`` with 8 bytes in its middle zeroed (the ``corrupt`` fault), same length."""
    middle = len(payload) // 2
    return payload[:middle] + bytes(8) + payload[middle + 8 :]


@dataclass(frozen=True)
class FaultPlan:
    """All faults of a run."""

    faults: tuple[Fault, ...] = ()

    def active(self, kind: str, round_index: int, attempt: int) -> list[Fault]:
        """Faults of ``kind`` for this round attempt."""
        return [f for f in self.faults if f.kind == kind and f.applies(round_index, attempt)]

    def hits(self, kind: str, participant: str, round_index: int, attempt: int) -> Fault | None:
        """The fault of ``kind`` targeting ``participant`` in this attempt, if any."""
        for fault in self.active(kind, round_index, attempt):
            if fault.participant == participant:
                return fault
        return None


def parse_faults(spec: str, participants: list[str] | None = None) -> FaultPlan:
    """Parse a ``--faults`` string.

    Args:
        spec: Comma-separated faults (empty for none).
        participants: Valid participant ids, to reject typos.

    Raises:
        UsageError: An entry is malformed or names an unknown participant.
    """
    faults = []
    for raw in (part.strip() for part in spec.split(",")):
        if not raw:
            continue
        m = _FAULT.match(raw)
        if m is None:
            raise UsageError(
                f"--faults entry '{raw}' is not valid;",
                remediation="write e.g. drop:alpine@3, delay:coastal@5, reorder@2, "
                "duplicate:delta@4 or corrupt:delta@4 (rounds are 0-based).",
            )
        kind = "delay" if m["kind"] == "late" else m["kind"]
        pid = m["pid"]
        if (kind in _NEEDS_PARTICIPANT) != (pid is not None):
            need = "needs a participant, as in" if pid is None else "takes no participant, as in"
            example = f"{kind}:alpine@3" if pid is None else f"{kind}@3"
            raise UsageError(f"--faults entry '{raw}' {need} {example}.")
        if participants is not None and pid is not None and pid not in participants:
            raise UsageError(
                f"--faults entry '{raw}' names '{pid}', which is not a participant;",
                remediation=f"use one of {', '.join(sorted(participants))}.",
            )
        faults.append(
            Fault(
                kind=kind,
                participant=pid,
                round_index=int(m["round"]),
                attempt=int(m["attempt"]) if m["attempt"] is not None else None,
                seconds=float(m["seconds"]) if m["seconds"] is not None else None,
            )
        )
    return FaultPlan(tuple(faults))
