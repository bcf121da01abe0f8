"""Fault plans for the in-process transport: drop, delay, reorder, duplicate, corrupt, ...

The kinds are drop, delay, reorder, duplicate, corrupt, poison and rank_kill
(:mod:`lensemble.federation.fault_kinds`, where help text finds them too).

A plan is a comma-separated list (``--faults`` on ``lensemble simulate``)::

    drop:alpine@3          alpine submits nothing in round 3 (every attempt)
    drop:alpine@3.0        ... only in attempt 0 of round 3
    delay:coastal@5        coastal's submission arrives after round 5's deadline (a late message)
    delay:coastal@5=12.5   ... arrives 12.5 virtual seconds after the round opened
    reorder@2              submissions of round 2 arrive in reverse order
    duplicate:delta@4      delta's submission of round 4 arrives twice
    corrupt:delta@4        delta's submission of round 4 arrives with damaged bytes
    poison:delta@4=1e4     every value of delta's round-4 update is 1e4 (a well-formed payload)
    rank_kill:alpine@2     rank 1 of alpine's rank group dies in round 2 (alpine needs ranks)
    rank_kill:alpine@2=3   ... rank 3 dies

Rounds are 0-based. ``rank_kill`` is the one kind a participant process applies to itself
(``fault_kinds.PARTICIPANT_KINDS``), so it also reaches the processes of a network run
(``lensemble participant --faults``); every other kind is the in-process transport's.
Faults change which participants contribute (and ``poison`` what one of
them sends, as a compromised participant would); they never change how the coordinator reduces
(docs/concepts.md#deterministic-aggregation).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from lensemble.errors import UsageError
from lensemble.federation.fault_kinds import (
    ALIASES,
    FAULT_KINDS,
    PARTICIPANT_KINDS,
    examples,
    kind_names,
)
from lensemble.federation.payload import bytes_hash, decode, encode
from lensemble.federation.quantization import SCALE_SUFFIX

_FAULT = re.compile(
    rf"^(?P<kind>{'|'.join(kind_names())})"
    r"(?::(?P<pid>[a-z0-9]([-a-z0-9]*[a-z0-9])?))?"
    r"@(?P<round>\d+)(?:\.(?P<attempt>\d+))?(?:=(?P<value>[^,=@]+))?$"
)
_SECONDS = re.compile(r"^\d+(?:\.\d+)?$")
_NEEDS_PARTICIPANT = {kind.name for kind in FAULT_KINDS if kind.participant}
_RANK = re.compile(r"^\d+$")


@dataclass(frozen=True)
class Fault:
    """One injected fault.

    Attributes:
        kind: ``drop``, ``delay`` (``late`` is an alias), ``reorder``, ``duplicate``, ``corrupt``,
            ``poison``, ``rank_kill``.
        participant: Target participant (None for ``reorder``).
        round_index: Round it applies to.
        attempt: Attempt it applies to (None: every attempt).
        seconds: For ``delay``: virtual seconds after opening (None: past the deadline).
        value: For ``poison``: the value every element of the update is set to; for
            ``rank_kill``: the rank that dies (default 1).
    """

    kind: str
    participant: str | None
    round_index: int
    attempt: int | None = None
    seconds: float | None = None
    value: float | None = None

    def applies(self, round_index: int, attempt: int) -> bool:
        """True when the fault targets this round attempt."""
        return self.round_index == round_index and self.attempt in (None, attempt)

    def spec(self) -> str:
        """The ``--faults`` entry that :func:`parse_faults` reads back as this fault."""
        text = self.kind + (f":{self.participant}" if self.participant else "")
        text += f"@{self.round_index}" + (f".{self.attempt}" if self.attempt is not None else "")
        if self.kind == "rank_kill":
            return f"{text}={int(self.value or 1)}"
        if self.value is not None:
            return f"{text}={self.value!r}"
        if self.seconds is not None:
            shown = repr(self.seconds)
            return f"{text}={shown if _SECONDS.match(shown) else format(self.seconds, 'f')}"
        return text


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

    def spec(self) -> str:
        """The plan as a ``--faults`` string (empty for no fault)."""
        return ",".join(fault.spec() for fault in self.faults)

    def of_participant(self, participant: str) -> FaultPlan:
        """The faults ``participant`` applies to itself (:data:`PARTICIPANT_KINDS` naming it)."""
        return FaultPlan(
            tuple(
                f
                for f in self.faults
                if f.kind in PARTICIPANT_KINDS and f.participant == participant
            )
        )

    def require_participant_kinds(self, remediation: str) -> None:
        """Refuse a plan holding a kind only the in-process transport injects.

        Raises:
            UsageError: Names the first such entry; ``remediation`` says what to do instead.
        """
        for fault in self.faults:
            if fault.kind not in PARTICIPANT_KINDS:
                raise UsageError(
                    f"--faults entry '{fault.spec()}' is injected by the in-process transport "
                    "only;",
                    remediation=remediation,
                )

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
    entries = (part.strip() for part in spec.split(","))
    return FaultPlan(tuple(_parse_fault(raw, participants) for raw in entries if raw))


def _parse_fault(raw: str, participants: list[str] | None) -> Fault:
    """One ``--faults`` entry (see :func:`parse_faults`)."""
    m = _FAULT.match(raw)
    if m is None:
        raise UsageError(
            f"--faults entry '{raw}' is not valid;",
            remediation=f"write e.g. {examples()} (rounds are 0-based).",
        )
    kind = ALIASES.get(m["kind"], m["kind"])
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
    seconds, value = _fault_value(raw, kind, m["value"])
    return Fault(
        kind=kind,
        participant=pid,
        round_index=int(m["round"]),
        attempt=int(m["attempt"]) if m["attempt"] is not None else None,
        seconds=seconds,
        value=value,
    )


def _fault_value(raw: str, kind: str, text: str | None) -> tuple[float | None, float | None]:
    """``(seconds, value)`` of an entry's ``=...`` part: a delay, a poison value or a rank."""
    if kind == "poison":
        return None, _poison_value(raw, text)
    if kind == "rank_kill":
        rank = text or "1"
        if not _RANK.match(rank) or int(rank) < 1:
            raise UsageError(
                f"--faults entry '{raw}' needs a rank from 1 up after '=', as in "
                "rank_kill:alpine@2=1 (rank 0 talks to the coordinator)."
            )
        return None, float(rank)
    if text is None:
        return None, None
    if kind != "delay" or not _SECONDS.match(text):
        raise UsageError(
            f"--faults entry '{raw}' has '={text}', which only delay (seconds, "
            "as in delay:coastal@5=12.5) and poison (a number) take."
        )
    return float(text), None


def participant_faults(spec: str, participants: list[str], participant: str) -> FaultPlan:
    """Parse the ``--faults`` of a participant process: the entries it applies to itself.

    Args:
        spec: Comma-separated faults, as for :func:`parse_faults`.
        participants: Valid participant ids.
        participant: This process's participant id.

    Returns:
        The ``rank_kill`` entries naming ``participant`` (entries naming others are ignored:
        a launcher may hand every process the same plan).

    Raises:
        UsageError: An entry is malformed, names an unknown participant, or is of a kind only
            the in-process transport injects.
    """
    plan = parse_faults(spec, participants)
    plan.require_participant_kinds(
        "a participant process applies only rank_kill to itself; run `lensemble simulate` in "
        "process for the other kinds."
    )
    return plan.of_participant(participant)


def _poison_value(raw: str, text: str | None) -> float:
    try:
        if text is not None:
            return float(text)
    except ValueError:
        pass
    raise UsageError(
        f"--faults entry '{raw}' needs the poison value as a number, as in poison:delta@4=1e4."
    )


def poison_payload(payload: bytes, value: float) -> tuple[bytes, str]:
    """A compromised participant's version of its own update: every value set to ``value``.

    The result is a well-formed payload with the original metadata (round, base hash, ...), so
    only the coordinator's defences stand between it and the global model. In int8, every code
    is +-127 with scale ``|value| / 127`` (codes 0 and scale 1 for 0), so each decoded value is
    ``value`` up to rounding; in fp16/bf16 the value is cast (it may overflow to Inf).

    Args:
        payload: The participant's sealed payload (trusted: it comes from this process).
        value: The value to set (any float, including NaN and Inf).

    Returns:
        ``(payload, payload_hash)``.
    """
    decoded = decode(payload)
    poisoned: dict[str, torch.Tensor] = {}
    for name, t in decoded.tensors.items():
        if name.endswith(SCALE_SUFFIX):
            continue
        if t.dtype == torch.int8:
            code = 0 if value == 0 else (127 if value > 0 else -127)
            scale = 1.0 if value == 0 else abs(value) / 127.0
            poisoned[name] = torch.full_like(t, code)
            poisoned[name + SCALE_SUFFIX] = torch.full_like(
                decoded.tensors[name + SCALE_SUFFIX], scale
            )
        else:
            poisoned[name] = torch.full_like(t, value)
    metadata = {k: v for k, v in decoded.metadata.items() if k != "format"}
    data = encode(poisoned, metadata)
    return data, bytes_hash(data)
