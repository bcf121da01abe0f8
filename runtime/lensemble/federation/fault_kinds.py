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
    FaultKind("scaled", "scaled:delta@0-=-9.5", "from round 0 on delta sends -9.5 x its update"),
    FaultKind("alie", "alie:delta@0-", "'a little is enough': mu - z sigma"),
    FaultKind("ipm", "ipm:delta@0-=4", "inner-product manipulation: -4 x mu"),
    FaultKind("minmax", "minmax:delta@0-=std", "min-max, perturbation -std (or unit, sign)"),
    FaultKind("minsum", "minsum:delta@10-", "a sleeper: honest until round 10, then min-sum"),
    FaultKind("misreport", "misreport:delta@0-=0.1", "delta reports 0.1 x its held-out loss"),
    FaultKind(
        "alie_omniscient",
        "alie_omniscient:delta@0-",
        "ALIE from the round's honest updates themselves, in process only",
    ),
    FaultKind("ipm_omniscient", "ipm_omniscient:delta@0-", "IPM from them"),
    FaultKind("minmax_omniscient", "minmax_omniscient:delta@0-", "min-max from them"),
    FaultKind("minsum_omniscient", "minsum_omniscient:delta@0-", "min-sum from them"),
)

#: Other names a plan may use for a kind.
ALIASES: dict[str, str] = {"late": "delay"}

#: Attacks a compromised participant makes from what it sees itself (its own update and the
#: broadcast models; :mod:`lensemble.federation.attacks`).
ESTIMATING_ATTACKS = frozenset({"scaled", "alie", "ipm", "minmax", "minsum"})
#: Attacks that see the honest updates of the round (colluding with the in-process transport:
#: the strongest assumption, simulation only).
OMNISCIENT_ATTACKS = frozenset(
    {"alie_omniscient", "ipm_omniscient", "minmax_omniscient", "minsum_omniscient"}
)
ATTACK_KINDS = ESTIMATING_ATTACKS | OMNISCIENT_ATTACKS

#: Kinds a participant applies to itself (over the network too); the others happen in the
#: in-process transport.
PARTICIPANT_KINDS = frozenset({"rank_kill", "misreport"}) | ESTIMATING_ATTACKS


def kind_names() -> tuple[str, ...]:
    """Every name a plan may write, aliases included."""
    return (*(kind.name for kind in FAULT_KINDS), *ALIASES)


def examples() -> str:
    """One example entry of every kind, as an English list (for error messages)."""
    shown = [kind.example for kind in FAULT_KINDS]
    return ", ".join(shown[:-1]) + " or " + shown[-1]


def faults_help() -> str:
    """The ``--faults`` help: the syntax and every kind with its example."""
    # The example last, in parentheses: an example ending in "@0-" never ends a line.
    kinds = "; ".join(f"{kind.what} ({kind.example})" for kind in FAULT_KINDS)
    return (
        "Inject faults: a comma-separated plan of KIND:ID@ROUNDS[=VALUE] entries; ROUNDS is "
        "R, R.ATTEMPT, R- (R and later) or R-S, rounds 0-based as in the ledger. "
        f"Kinds: {kinds}. Attacks: docs/attacks.md."
    )
