"""Fault plans: transport faults (drop, delay, ...) and attacks a participant makes on itself.

A plan is a comma-separated list (``--faults`` on ``lensemble simulate`` and ``lensemble
participant``), one grammar for every kind: ``KIND[:PARTICIPANT]@ROUNDS[=VALUE]``. ``ROUNDS`` is
one round (``@3``), one attempt of it (``@3.0``), a round and every later one (``@3-``) or an
inclusive range (``@3-7``); rounds are 0-based. The kinds are
:data:`~lensemble.federation.fault_kinds.FAULT_KINDS` (where help text finds them too)::

    drop:alpine@3          alpine submits nothing in round 3 (every attempt)
    drop:alpine@3.0        ... only in attempt 0 of round 3
    delay:coastal@5        coastal's submission arrives after round 5 closed (a late message)
    delay:coastal@5=12.5   ... arrives 12.5 virtual seconds after the round opened (in time
                           unless the round closed before: its deadline, a straggler cutoff)
    reorder@2              submissions of round 2 arrive in reverse order
    duplicate:delta@4      delta's submission of round 4 arrives twice
    corrupt:delta@4        delta's submission of round 4 arrives with damaged bytes
    poison:delta@4=1e4     every value of delta's round-4 update is 1e4 (a well-formed payload)
    rank_kill:alpine@2     rank 1 of alpine's rank group dies in round 2 (alpine needs ranks)
    rank_kill:alpine@2=3   ... rank 3 dies
    scaled:delta@0-=-9.5   from round 0 on, delta sends -9.5 x its honest update
    alie:delta@0-          "a little is enough": mu - z sigma (z from n and f, or =Z)
    ipm:delta@0-=4         inner-product manipulation: -4 x mu
    minmax:delta@0-=std    min-max with perturbation -std (also unit, sign)
    minsum:delta@0-        min-sum, perturbation -std
    alie:delta@10-         a sleeper: honest until round 10, then ALIE
    misreport:delta@0-=0.1 delta reports 0.1 x its true held-out loss
    alie_omniscient:delta@0-   ALIE from the honest updates of the round themselves

The attack kinds and what their estimates see are :mod:`lensemble.federation.attacks`
(docs/attacks.md). A participant process applies the kinds of ``fault_kinds.PARTICIPANT_KINDS`` to
itself, so they also reach the processes of a network run (``lensemble participant --faults``);
every other kind (the ``*_omniscient`` attacks among them: they need the other participants'
updates) is the in-process transport's. Faults change which participants contribute and what a
compromised participant sends; they never change how the coordinator reduces
(docs/concepts.md#deterministic-aggregation).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from lensemble.errors import UsageError
from lensemble.federation.fault_kinds import (
    ALIASES,
    ATTACK_KINDS,
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
    r"@(?P<round>\d+)(?:\.(?P<attempt>\d+)|(?P<onward>-)(?P<last>\d+)?)?"
    r"(?:=(?P<value>[^,=@]+))?$"
)
_SECONDS = re.compile(r"^\d+(?:\.\d+)?$")
_RANK = re.compile(r"^\d+$")

#: Every kind a plan may name (aliases aside).
KINDS = frozenset(kind.name for kind in FAULT_KINDS)
_NEEDS_PARTICIPANT = {kind.name for kind in FAULT_KINDS if kind.participant}
#: Perturbation directions of min-max and min-sum (Shejwalkar & Houmansadr, NDSS 2021).
DIRECTIONS = ("std", "unit", "sign")
_WORD_VALUED = frozenset({"minmax", "minsum", "minmax_omniscient", "minsum_omniscient"})
_NUMBER_REQUIRED = frozenset({"poison", "scaled", "misreport"})
_NUMBER_OPTIONAL = frozenset({"alie", "ipm", "alie_omniscient", "ipm_omniscient"})


@dataclass(frozen=True)
class Fault:
    """One injected fault.

    Attributes:
        kind: One of :data:`KINDS` (``late`` is read as ``delay``).
        participant: Target participant (None for ``reorder``).
        round_index: First round it applies to.
        attempt: Attempt it applies to (None: every attempt).
        seconds: For ``delay``: virtual seconds after opening (None: past the deadline).
        value: For ``poison``: the value every element of the update is set to; for
            ``rank_kill``: the rank that dies (default 1); for an attack: its number (the
            factor of ``scaled``, ``z`` of ALIE, ``epsilon`` of IPM); for ``misreport``: the
            factor applied to the reported held-out loss.
        option: For min-max and min-sum: the perturbation direction (:data:`DIRECTIONS`).
        until: Last round it applies to (inclusive); None: only ``round_index``, unless
            ``onward``.
        onward: It applies to ``round_index`` and every later round.
    """

    kind: str
    participant: str | None
    round_index: int
    attempt: int | None = None
    seconds: float | None = None
    value: float | None = None
    option: str | None = None
    until: int | None = None
    onward: bool = False

    def applies(self, round_index: int, attempt: int) -> bool:
        """True when the fault targets this round attempt."""
        last = self.round_index if self.until is None else self.until
        in_rounds = self.round_index <= round_index and (self.onward or round_index <= last)
        return in_rounds and self.attempt in (None, attempt)

    def _rounds(self) -> str:
        if self.onward:
            return f"@{self.round_index}-"
        if self.until is not None:
            return f"@{self.round_index}-{self.until}"
        return f"@{self.round_index}" + (f".{self.attempt}" if self.attempt is not None else "")

    def spec(self) -> str:
        """The ``--faults`` entry that :func:`parse_faults` reads back as this fault."""
        text = self.kind + (f":{self.participant}" if self.participant else "") + self._rounds()
        if self.kind == "rank_kill":
            return f"{text}={int(self.value or 1)}"
        if self.option is not None:
            return f"{text}={self.option}"
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
    """All faults of a run.

    Attributes:
        faults: The entries, in the order given.
        colluders: How many participants the whole plan attacks with (kept when a participant
            takes only its own entries, :meth:`of_participant`: ALIE's ``z`` depends on it);
            None: count this plan's own attackers.
    """

    faults: tuple[Fault, ...] = ()
    colluders: int | None = None

    @property
    def hostile(self) -> int:
        """How many participants attack together (``f`` of the attacks' formulas)."""
        return self.colluders if self.colluders is not None else len(self.attackers())

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
            ),
            colluders=self.hostile,
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

    def attackers(self) -> frozenset[str]:
        """The participants the plan attacks with (any of :data:`ATTACK_KINDS`)."""
        return frozenset(
            f.participant for f in self.faults if f.kind in ATTACK_KINDS and f.participant
        )

    def attack_on(self, participant: str, round_index: int, attempt: int) -> Fault | None:
        """The first attack entry of ``participant`` applying to this attempt, if any."""
        for fault in self.faults:
            if (
                fault.kind in ATTACK_KINDS
                and fault.participant == participant
                and fault.applies(round_index, attempt)
            ):
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
            remediation=f"write e.g. {examples()} (rounds are 0-based; @3- is round 3 on, "
            "@3-7 rounds 3 to 7).",
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
    first, until, onward = _rounds(raw, m)
    seconds, value, option = _fault_value(raw, kind, m["value"])
    return Fault(
        kind=kind,
        participant=pid,
        round_index=first,
        attempt=int(m["attempt"]) if m["attempt"] is not None else None,
        seconds=seconds,
        value=value,
        option=option,
        until=until,
        onward=onward,
    )


def _rounds(raw: str, m: re.Match[str]) -> tuple[int, int | None, bool]:
    """``(first round, last round or None, onward)`` of an entry's ``@ROUNDS`` part."""
    first, last = int(m["round"]), m["last"]
    if last is not None and int(last) < first:
        raise UsageError(
            f"--faults entry '{raw}' ends its rounds before it starts;",
            remediation=f"write the first round first, as in @{last}-{first}.",
        )
    return first, int(last) if last is not None else None, m["onward"] is not None and last is None


def _fault_value(
    raw: str, kind: str, text: str | None
) -> tuple[float | None, float | None, str | None]:
    """``(seconds, value, option)`` of an entry's ``=...`` part (see :class:`Fault`)."""
    if kind == "rank_kill":
        rank = text or "1"
        if not _RANK.match(rank) or int(rank) < 1:
            raise UsageError(
                f"--faults entry '{raw}' needs a rank from 1 up after '=', as in "
                "rank_kill:alpine@2=1 (rank 0 talks to the coordinator)."
            )
        return None, float(rank), None
    if kind in _WORD_VALUED:
        if text is not None and text not in DIRECTIONS:
            raise UsageError(
                f"--faults entry '{raw}' has '={text}'; {kind} takes a perturbation "
                f"direction: {', '.join(DIRECTIONS)} (default std)."
            )
        return None, None, text
    if kind in _NUMBER_REQUIRED or (kind in _NUMBER_OPTIONAL and text is not None):
        return None, _number(raw, kind, text), None
    if text is None or kind in _NUMBER_OPTIONAL:
        return None, None, None
    if kind != "delay" or not _SECONDS.match(text):
        raise UsageError(
            f"--faults entry '{raw}' has '={text}', which only delay (seconds, as in "
            "delay:coastal@5=12.5), poison, rank_kill, misreport and the attacks take."
        )
    return float(text), None, None


def participant_faults(spec: str, participants: list[str], participant: str) -> FaultPlan:
    """Parse the ``--faults`` of a participant process: the entries it applies to itself.

    Args:
        spec: Comma-separated faults, as for :func:`parse_faults`.
        participants: Valid participant ids.
        participant: This process's participant id.

    Returns:
        The entries of :data:`PARTICIPANT_KINDS` naming ``participant`` (``rank_kill``,
        ``misreport`` and the estimating attacks; entries naming others are ignored: a launcher
        may hand every process the same plan, which also tells each attacker how many collude).

    Raises:
        UsageError: An entry is malformed, names an unknown participant, or is of a kind only
            the in-process transport injects.
    """
    plan = parse_faults(spec, participants)
    plan.require_participant_kinds(
        "a participant process applies only rank_kill, misreport and the estimating attacks "
        "(scaled, alie, ipm, minmax, minsum) to itself; run `lensemble simulate` in process "
        "for the other kinds."
    )
    return plan.of_participant(participant)


def _number(raw: str, kind: str, text: str | None) -> float:
    """The number after ``=``: any float for ``poison``, a finite one for the others."""
    try:
        if text is not None:
            value = float(text)
            if kind == "poison" or (math.isfinite(value) and (kind != "misreport" or value >= 0)):
                return value
    except ValueError:
        pass
    example = {
        "poison": "poison:delta@4=1e4",
        "scaled": "scaled:delta@0-=-9.5",
        "misreport": "misreport:delta@0-=0.1 (a factor from 0 up)",
        "alie": "alie:delta@0-=1.5 (z)",
        "ipm": "ipm:delta@0-=4 (epsilon)",
    }.get(kind.removesuffix("_omniscient"), f"{kind}:delta@0-=1")
    raise UsageError(f"--faults entry '{raw}' needs a finite number after '=', as in {example}.")


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
