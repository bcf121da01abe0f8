"""The coordinator's side of a masked attempt: one secure sum per group, then their mean.

Under ``federation.aggregation: masking`` the coordinator never holds a single participant's
update: it drives one session per group through the transport, every group's stage at once
under one deadline (:func:`lensemble.federation.secagg.driver.drive_together`, so silent members
in k groups cost one stage deadline, not k), and gets each group's sum of the survivors'
fixed-point updates. What it
keeps of the attempt (:class:`MaskedAttempt`):

- the combined pseudo-gradient: the survivors' mean (one group, or two), or with three or more
  groups and a robust aggregator (``median``, ``trimmed_mean``) the coordinate-wise median of
  the group means, so that a minority of poisoned groups cannot steer it (docs/security.md);
- the ledger's view: survivors as contributors, each with the SHA-256 and size of the masked
  vector it sent (what the coordinator received), every refusal and abort by its stable reason,
  and per group the sets of each stage, the sum's digest and the clipped-coordinate count.

A group whose session aborts contributes nothing and its members are excluded with the reason;
the attempt aborts when fewer than ``federation.quorum`` survivors remain in all groups.

With several groups the attempt's groups are drawn from its present set (:func:`present_now`):
the participants the transport counts present when the sessions start, less those that dropped
out of an earlier attempt's sessions of the same round (while enough remain), so that absent
participants are in no group and a retry regroups the ones still there. The set travels with
``advertise`` and is recorded (``defences.masking.present``, only when it is not every
configured participant); who is outside it is excluded as absent (the transport's reason, or
``masking_absent``) or ``masking_left_out``.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from lensemble.config.schema import LensembleConfig
from lensemble.federation.admission import self_reported
from lensemble.federation.attempt import Attempt, Collection
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.masking import (
    SessionKey,
    least_present,
    present_set,
    regroups,
    session_contexts,
)
from lensemble.federation.messages import RoundOpening
from lensemble.federation.payload import TensorSpec
from lensemble.federation.robustness import update_norm
from lensemble.federation.secagg.context import MIN_INPUTS, SessionContext
from lensemble.federation.secagg.driver import SessionsExchange, drive_together
from lensemble.federation.secagg.errors import Reason, SecAggAbort
from lensemble.federation.secagg.server import SecureSum, ServerSession
from lensemble.federation.transport import CoordinatorTransport

#: Aggregators that take the median of the group means when there are at least 3 groups.
ROBUST_OVER_GROUPS = ("median", "trimmed_mean")
#: The ledger's exclusion reason prefix of a participant whose group's session aborted.
ABORTED = "masking_aborted"
#: The ledger's exclusion reason of a participant absent when the attempt's groups were drawn
#: (for no reason the transport knows).
ABSENT = "masking_absent"
#: The ledger's exclusion reason of a participant left out of a retry's groups: it dropped out
#: of an earlier attempt's session of the round.
LEFT_OUT = "masking_left_out"
#: The ledger's exclusion reason of a participant left out of a retry: it signed a survivor set
#: in an earlier attempt of the round, so its update may be in that sum and stays out of others.
SIGNED = "masking_signed_earlier"
#: The aggregate bound's window: the last committed masked rounds whose median it scales, and
#: how many it needs before it applies.
AGGREGATE_WINDOW = 5
AGGREGATE_MIN_ROUNDS = 3


@dataclass
class MaskedAttempt:
    """What a masked attempt gave the coordinator.

    Attributes:
        collection: The ledger's view of the attempt (``survivors`` set: the contributors).
        mean: The combined pseudo-gradient (d float32 values), or None when the attempt
            cannot commit (below quorum in all groups).
        record: ``defences.masking``: per group its roster, every stage's set, the sum's
            digest, clipped coordinates, refusals, or why its session aborted.
    """

    collection: Collection
    mean: np.ndarray | None
    record: dict[str, object] = field(default_factory=dict)


class MaskedRoundOwner(Protocol):
    """What :func:`collect_masked` reads of the coordinator."""

    config: LensembleConfig
    architecture: dict[str, TensorSpec]

    @property
    def history(self) -> list[RoundRecord]:
        """Every earlier attempt of the run, in order."""
        ...


def collect_masked(
    owner: MaskedRoundOwner,
    current: Attempt,
    opening: RoundOpening,
    transport: CoordinatorTransport,
) -> None:
    """Run every group's session of the open attempt; the outcome goes to ``current``.

    Sets ``current.masked``, ``masked_mean`` (see :class:`MaskedAttempt`; bounded by
    :func:`bounded` over ``owner.history``), ``collection``, ``traffic`` and ``defences``
    (``aggregator: masking`` and the sessions' record).

    Args:
        owner: The coordinator: its config, the global model's architecture (d), the run's
            earlier attempts (the aggregate bound's window).
        current: The attempt.
        opening: The attempt, already opened on ``transport`` (participants have trained).
        transport: Carries the sessions' messages.
    """
    config, architecture, history = owner.config, owner.architecture, owner.history
    dropped = dropped_earlier(history, opening.round_index)
    signed = signed_earlier(history, opening.round_index)
    masked = masked_attempt(config, opening, transport, architecture, dropped, signed=signed)
    if masked.mean is not None:
        factor = config.federation.masking.aggregate_factor
        masked.mean, masked.record["aggregate"] = bounded(masked.mean, history, factor)
    current.masked, current.masked_mean = True, masked.mean
    current.collection = masked.collection
    current.traffic = transport.take_traffic()
    current.defences = {"aggregator": "masking", "masking": masked.record}


def masked_attempt(
    config: LensembleConfig,
    opening: RoundOpening,
    transport: CoordinatorTransport,
    architecture: Mapping[str, TensorSpec],
    dropped: frozenset[str] = frozenset(),
    *,
    signed: frozenset[str] = frozenset(),
) -> MaskedAttempt:
    """Run every group's session of the open attempt and combine the sums.

    Args:
        config: The run's config.
        opening: The attempt, already opened on ``transport`` (participants have trained).
        transport: Carries the sessions' messages.
        architecture: The global model's tensor specs (d).
        dropped: Who dropped out of an earlier attempt's sessions of this round
            (:func:`dropped_earlier`): left out of the groups while enough remain.
        signed: Who signed a survivor set in an earlier attempt of this round
            (:func:`signed_earlier`): always left out of the groups (each would refuse).
    """
    col = Collection(opening, frozenset(config.participant_ids))
    # Who is present first: over the network it waits for the training, and a participant
    # whose ranks fail meanwhile sits out with a reason the absences then carry.
    known = transport.masking_present() if regroups(config) else None
    # Who sent nothing for a known reason (its ranks failed, it left) is named as such.
    absence = transport.absence_reasons()
    col.rejected.update(absence)
    here, left_out = present_now(config, known, absence, dropped, signed)
    for pid, reason in left_out.items():
        col.rejected.setdefault(pid, reason)
        col.details.setdefault(pid, _LEFT_OUT_DETAIL[reason])
    if left_out and len(here) < least_present(config):
        # Too few to group: no session could reach the quorum, and no group its size.
        return MaskedAttempt(col, None, {"present": list(here), "groups": []})
    present = present_set(config, here)
    record: dict[str, object] = {"present": list(present)} if present else {}
    contexts = session_contexts(
        config, opening.round_index, opening.attempt, architecture, present or None
    )
    combiner = _Combiner(config.federation.robustness.aggregator)
    groups = _run_sessions(config, contexts, transport, col, combiner)
    survivors = sorted(combiner.survivors)
    col.survivors = tuple(survivors)
    reports = transport.masked_reports()
    for pid in survivors:
        col.reported[pid] = self_reported(reports.get(pid, {}))
    enough = len(survivors) >= config.federation.quorum and combiner.groups > 0
    mean = combiner.mean() if enough else None
    return MaskedAttempt(col, mean, {**record, "groups": groups})


def _run_sessions(
    config: LensembleConfig,
    contexts: Sequence[SessionContext],
    transport: CoordinatorTransport,
    col: Collection,
    combiner: _Combiner,
) -> list[dict[str, object]]:
    """Drive every group's session in lock-step; fold each sum into ``combiner`` in order.

    Returns:
        Each group's ledger entry, in group order.
    """
    verifiers = transport.masking_identities()
    servers = {
        SessionKey(ctx.round, ctx.attempt, ctx.group): ServerSession(
            ctx, {p: verifiers[p] for p in ctx.roster if p in verifiers}
        )
        for ctx in contexts
    }
    # Every group's sessions in lock-step: silent members in k groups cost one deadline.
    # With several groups the quorum is the round's, over all groups (one group: its session's).
    gate = config.federation.quorum if regroups(config) else 0
    outcomes = drive_together(servers, _recording(transport, col), gate)
    groups: list[dict[str, object]] = []
    for key, ctx in zip(list(servers), contexts, strict=True):
        outcome = outcomes.pop(key)
        signers = servers.pop(key).signers  # its d-word sum goes as soon as it is folded in
        if isinstance(outcome, SecAggAbort):
            groups.append(_aborted(ctx, outcome, col, signers))
            continue
        groups.append(_summed(ctx, outcome, col))
        combiner.add(ctx, outcome)
        del outcome
    return groups


_LEFT_OUT_DETAIL = {
    ABSENT: "absent when the attempt's groups were drawn",
    LEFT_OUT: "dropped out of an earlier attempt's session of this round; left out of the groups",
    SIGNED: "signed a survivor set in an earlier attempt of this round; its update is in no "
    "second sum",
}


def present_now(
    config: LensembleConfig,
    known: Iterable[str] | None,
    absence: Mapping[str, str],
    dropped: Iterable[str],
    signed: Iterable[str] = (),
) -> tuple[tuple[str, ...], dict[str, str]]:
    """The attempt's present set, and why each configured participant outside it is out.

    With one group there is none (every configured participant is on the roster). Otherwise
    the present set is the transport's (``known``; None: everyone without an absence reason),
    less ``signed``, and less ``dropped`` unless that leaves fewer than :func:`least_present`.

    Args:
        config: The run's config.
        known: Who the transport counts present (``masking_present``), or None.
        absence: The transport's absence reasons (participant id -> reason).
        dropped: Who dropped out of an earlier attempt's sessions of this round.
        signed: Who signed a survivor set in an earlier attempt of this round.

    Returns:
        The present set, sorted (every configured participant with one group), and participant
        id -> ``masking_absent``, ``masking_signed_earlier`` or ``masking_left_out`` for the
        others (the caller keeps a transport's reason before these).
    """
    ids = sorted(config.participant_ids)
    if not regroups(config):
        return tuple(ids), {}
    here = set(ids) & set(known) if known is not None else set(ids) - set(absence)
    out = {pid: ABSENT for pid in ids if pid not in here}
    burned = here & set(signed)
    out.update(dict.fromkeys(sorted(burned), SIGNED))
    here -= burned
    kept = here - set(dropped)
    if kept != here and len(kept) >= least_present(config):
        out.update(dict.fromkeys(sorted(here - kept), LEFT_OUT))
        here = kept
    return tuple(sorted(here)), out


def dropped_earlier(history: Sequence[RoundRecord], round_index: int) -> frozenset[str]:
    """Who dropped out of a session of an earlier attempt of ``round_index``, from the ledger.

    A member of a group that summed without it, or of a group that aborted below threshold
    without being among the last stage's participants, dropped out.
    """
    dropped: set[str] = set()
    for group in _round_groups(history, round_index):
        roster = set(group.get("roster", []))
        if "survivors" in group:
            dropped |= roster - set(group["survivors"])
        elif group.get("aborted") in _NAMED_THE_REST:
            dropped |= roster - set(group.get("named", []))
    return frozenset(dropped)


def _round_groups(history: Sequence[RoundRecord], round_index: int) -> Iterator[dict[str, Any]]:
    """Every group entry (``defences.masking.groups``) of the ledger's attempts of a round."""
    for record in history:
        masking = record.defences.get("masking") if record.round == round_index else None
        groups = masking.get("groups") if isinstance(masking, dict) else None
        yield from (g for g in (groups if isinstance(groups, list) else []) if isinstance(g, dict))


def retry_possible(
    config: LensembleConfig, history: Sequence[RoundRecord], round_index: int
) -> bool:
    """Whether a retry of ``round_index`` could commit under masking, from the ledger.

    Who signed a survivor set in an earlier attempt of the round takes part in no later one
    (:func:`signed_earlier`), so a retry needs enough others: the fewest a present set may hold
    (several groups), or the session's fewest survivors, max(quorum, 3, t) (one group; once a
    session of t > n / 2 signers was unmasked, never). True without masking.
    """
    if config.federation.aggregation != "masking":
        return True
    ids = config.participant_ids
    fresh = len(set(ids) - signed_earlier(history, round_index))
    if regroups(config):
        return fresh >= least_present(config)
    fed = config.federation
    return fresh >= max(fed.quorum, MIN_INPUTS, fed.masking.resolved_threshold(len(ids)))


#: Aborts whose ``named`` are the members still in the session (the rest dropped out).
_NAMED_THE_REST = (Reason.BELOW_THRESHOLD.value, Reason.BELOW_QUORUM.value)


def signed_earlier(history: Sequence[RoundRecord], round_index: int) -> frozenset[str]:
    """Who signed a survivor set in an earlier attempt of ``round_index``, from the ledger.

    Each may have its update in that session's sum, so it takes part in no later attempt of
    the round (its :class:`~lensemble.federation.masking_client.MaskingClient` refuses).
    """
    signed: set[str] = set()
    for group in _round_groups(history, round_index):
        if isinstance(group.get("signed"), list):
            signed |= {p for p in group["signed"] if isinstance(p, str)}
    return frozenset(signed)


def _recording(transport: CoordinatorTransport, col: Collection) -> SessionsExchange[SessionKey]:
    """The transport's exchange of the attempt's sessions, noting each masked vector's hash, size.

    Lazy, and holds no answer while it waits for the next: the session adds each masked vector
    to its running sum and drops it, so at most one is ever in the coordinator's memory.
    """

    def exchange(
        stage: str, outgoing: Mapping[str, tuple[SessionKey, bytes]]
    ) -> Iterator[tuple[str, bytes | memoryview]]:
        for sender, data in transport.exchange(stage, outgoing):
            if stage == "mask":
                col.hashes[sender] = "sha256:" + hashlib.sha256(data).hexdigest()
                col.sizes[sender] = len(data)
            yield sender, data
            del data

    return exchange


def _summed(ctx: SessionContext, result: SecureSum, col: Collection) -> dict[str, object]:
    """A finished session's ledger entry; its refused and dropped members join the exclusions."""
    for pid, reason in result.refusals:
        col.rejected.setdefault(pid, reason)
    for pid in ctx.roster:
        if pid not in result.survivors:
            col.rejected.setdefault(pid, "masking_dropped")
            col.details.setdefault(pid, f"left group {ctx.group}'s session before its sum")
    return {
        "group": ctx.group,
        "roster": list(ctx.roster),
        "threshold": ctx.threshold,
        "advertised": list(result.advertised),
        "shared": list(result.shared),
        "survivors": list(result.survivors),
        "signed": list(result.signed),
        "unmasked": list(result.unmasked),
        "sum": f"sha256:{result.digest()}",
        "clipped": result.clipped,
        "refusals": [[pid, reason] for pid, reason in result.refusals],
    }


def _aborted(
    ctx: SessionContext, abort: SecAggAbort, col: Collection, signers: Sequence[str] = ()
) -> dict[str, object]:
    """An aborted session's ledger entry; every member is excluded with its reason.

    ``signed`` (who signed its survivor set, when it got that far) is recorded: they stay out
    of the round's later attempts (:func:`signed_earlier`).
    """
    for pid in ctx.roster:
        col.rejected.setdefault(pid, f"{ABORTED}:{abort.reason.value}")
        col.details.setdefault(pid, str(abort)[:240])
    entry: dict[str, object] = {
        "group": ctx.group,
        "roster": list(ctx.roster),
        "threshold": ctx.threshold,
        "aborted": abort.reason.value,
        "stage": abort.stage,
        "named": list(abort.participants),
    }
    if signers:
        entry["signed"] = list(signers)
    return entry


class _Combiner:
    """The groups' sums folded in as each session ends, so no group's d-word sum outlives it.

    Keeps one float64 running sum of the decoded group sums (d values), and with a robust
    aggregator each group's float64 mean as well (the median of the means needs them all). The
    result is :meth:`mean`: the survivors' mean (float32), or with 3+ groups and a robust
    aggregator the coordinate-wise median of the group means. Every step is exact or rounds
    once, in the groups' order, so the bits depend on the sums only, never on arrival order.

    Args:
        aggregator: ``federation.robustness.aggregator``.
    """

    def __init__(self, aggregator: str) -> None:
        self._robust = aggregator in ROBUST_OVER_GROUPS
        self._total: np.ndarray | None = None
        self._means: list[np.ndarray] = []
        self.survivors: list[str] = []
        self.groups = 0

    def add(self, ctx: SessionContext, result: SecureSum) -> None:
        """Fold in one finished session's sum (its survivors' encoded updates)."""
        decoded = ctx.codec.decode_sum(result.total[: ctx.dimension])
        if self._robust:
            self._means.append(decoded / len(result.survivors))
        if self._total is None:
            self._total = decoded
        else:
            self._total += decoded
        self.survivors.extend(result.survivors)
        self.groups += 1

    def mean(self) -> np.ndarray:
        """The combined pseudo-gradient (d float32 values); at least one group was added."""
        assert self._total is not None, "no group's sum was added"
        if self.groups >= 3 and self._robust:
            median: np.ndarray = np.median(np.stack(self._means), axis=0)
            return median.astype(np.float32)
        return (self._total / len(self.survivors)).astype(np.float32)


def bounded(
    mean: np.ndarray, history: Sequence[RoundRecord], factor: float | None
) -> tuple[np.ndarray, dict[str, float]]:
    """``mean`` scaled down to ``factor`` times the median of recent committed norms.

    The window is the last :data:`AGGREGATE_WINDOW` committed masked rounds' norms after
    bounding (so an attacker cannot ratchet the bound up faster than ``factor`` per window);
    the bound applies once :data:`AGGREGATE_MIN_ROUNDS` exist. Norms are float64 on one thread
    and the scaling rounds once to float32, so the bits depend on the inputs only.

    Returns:
        The (possibly scaled) mean, and the ledger entry: ``norm`` before, ``applied`` after,
        and ``bound`` when one applied.
    """
    norm = update_norm({"mean": torch.from_numpy(mean)})
    entry = {"norm": norm, "applied": norm}
    recent = [n for n in (_applied_norm(r) for r in history if r.state == "closed") if n][
        -AGGREGATE_WINDOW:
    ]
    if factor is None or len(recent) < AGGREGATE_MIN_ROUNDS:
        return mean, entry
    bound = factor * statistics.median(recent)
    entry["bound"] = bound
    if norm <= bound:
        return mean, entry
    scaled = (torch.from_numpy(mean).double() * (bound / norm)).to(torch.float32).numpy()
    entry["applied"] = update_norm({"mean": torch.from_numpy(scaled)})
    return scaled, entry


def _applied_norm(record: RoundRecord) -> float | None:
    """A committed masked round's combined norm after its bound, from its ledger record."""
    masking = record.defences.get("masking")
    aggregate = masking.get("aggregate") if isinstance(masking, dict) else None
    applied = aggregate.get("applied") if isinstance(aggregate, dict) else None
    return float(applied) if isinstance(applied, (int, float)) else None
