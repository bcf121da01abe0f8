"""The kinds of fault a ``--faults`` plan may inject, written once.

:mod:`lensemble.federation.faults` parses plans with these kinds and its error messages show
these examples; ``lensemble simulate --help`` lists them from here. This module imports nothing
heavy, so help text can be built from it without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FaultKind:
    """One kind of fault.

    Attributes:
        name: The kind as written in a plan (``drop``).
        example: A plan entry of this kind (``drop:alpine@3``).
        what: What the example does, in a few words.
        participant: Whether an entry names a participant (``kind:ID@R``).
    """

    name: str
    example: str
    what: str
    participant: bool = True


#: Every kind, in the order help text lists them.
FAULT_KINDS: tuple[FaultKind, ...] = (
    FaultKind("drop", "drop:alpine@3", "alpine submits nothing in round 3"),
    FaultKind(
        "delay",
        "delay:coastal@5=12.5",
        "coastal's update arrives 12.5 s after round 5 opens; without =S, past its deadline",
    ),
    FaultKind("reorder", "reorder@2", "round 2's updates arrive in reverse order", False),
    FaultKind("duplicate", "duplicate:delta@4", "delta's update arrives twice"),
    FaultKind("corrupt", "corrupt:delta@4", "delta's update arrives with damaged bytes"),
    FaultKind("poison", "poison:delta@4=1e4", "every value of delta's update is 1e4"),
    FaultKind("rank_kill", "rank_kill:alpine@2=1", "rank 1 of alpine's rank group dies"),
)

#: Other names a plan may use for a kind.
ALIASES: dict[str, str] = {"late": "delay"}

#: Kinds a participant applies to itself (over the network too); the others happen in the
#: in-process transport.
PARTICIPANT_KINDS = frozenset({"rank_kill"})


def kind_names() -> tuple[str, ...]:
    """Every name a plan may write, aliases included."""
    return (*(kind.name for kind in FAULT_KINDS), *ALIASES)


def examples() -> str:
    """One example entry of every kind, as an English list (for error messages)."""
    shown = [kind.example for kind in FAULT_KINDS]
    return ", ".join(shown[:-1]) + " or " + shown[-1]


def faults_help() -> str:
    """The ``--faults`` help: the syntax and every kind with its example."""
    kinds = "; ".join(f"{kind.example} ({kind.what})" for kind in FAULT_KINDS)
    return (
        "Inject faults: a comma-separated plan of KIND:ID@ROUND[.ATTEMPT][=VALUE] entries, "
        f"rounds 0-based as in the ledger. Kinds: {kinds}."
    )
