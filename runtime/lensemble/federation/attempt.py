"""One round attempt's bookkeeping, and the ledger record it ends with.

:class:`Collection` is what an attempt gathered while it collected (accepted updates' norms,
hashes, sizes and self-reported statistics; rejections and their details);
:class:`Attempt` adds what the coordinator learns after (traffic, defences) and when it opened;
:func:`attempt_record` turns both into the attempt's :class:`RoundRecord`, the one line the
ledger keeps of it, committed or aborted.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from lensemble import __version__
from lensemble.config.schema import RobustnessConfig
from lensemble.federation.guard import Judgement
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.messages import Reason, RoundOpening, Submission
from lensemble.federation.robustness import Screening, decide, momentum_shortfalls
from lensemble.federation.rounds import RoundMachine, RoundState
from lensemble.federation.set_aside import set_aside
from lensemble.federation.transport import Traffic


@dataclass
class Collection:
    """What the open attempt gathered so far.

    Attributes:
        opening: The attempt being collected.
        expected: Every configured participant id.
        norms: Accepted participant id -> L2 norm of its update (the updates themselves wait
            in the coordinator's spool).
        hashes: Accepted participant id -> ``sha256:<hex>`` of its payload.
        sizes: Accepted participant id -> payload bytes.
        reported: Accepted participant id -> its bounded self-reported statistics.
        cosines: Accepted participant id -> cosine of its update with the outer momentum the
            attempt started from (None when the momentum is zero).
        rejected: Participant id -> why its update for this attempt was refused (a reason code).
        details: Participant id -> the refusal's sentence.
        survivors: Under masking, the participants whose masked updates are in the sum (the
            contributors; no norm of a single update is known); None in a plain attempt.
    """

    opening: RoundOpening
    expected: frozenset[str]
    norms: dict[str, float] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    reported: dict[str, dict[str, float | None]] = field(default_factory=dict)
    cosines: dict[str, float | None] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)
    survivors: tuple[str, ...] | None = None

    @property
    def contributors(self) -> list[str]:
        """The participants whose updates the attempt combines, sorted."""
        return sorted(self.norms) if self.survivors is None else sorted(self.survivors)

    @property
    def complete(self) -> bool:
        """Every configured participant has an accepted update."""
        return self.expected <= set(self.norms)

    def targets(self, submission: Submission) -> bool:
        """True when ``submission`` is for this very attempt (not a stale or future one)."""
        key = (submission.round_index, submission.attempt)
        return key == (self.opening.round_index, self.opening.attempt)


def utc_now() -> str:
    """The current UTC time, ISO 8601 with milliseconds (the ledger's timestamps)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass
class Attempt:
    """A round attempt from its opening to its outcome.

    Attributes:
        machine: Its state machine.
        wall_start: ``time.perf_counter()`` at its start (seconds).
        opened_at: UTC time it opened (ISO 8601).
        collection: What it gathered (set once it opened).
        traffic: What the transport moved for it (set once collection ended).
        defences: What the defences decided (the ledger's ``defences``).
        guard: The divergence guard's verdict (the ledger's ``guard``; empty when off).
        judgement: The same verdict, to apply should the attempt commit.
        scores: The suspicion scores after this attempt, to apply should it commit.
        collect_s: Transport-clock seconds from its opening to its last accepted update
            (None before one; the ledger's ``extra.collect_s``, see ``stragglers``).
        masked: The attempt ran under masking (:mod:`lensemble.federation.masked_round`).
        masked_mean: Under masking, the combined pseudo-gradient (d float32 values), or None
            when it cannot commit.
    """

    machine: RoundMachine
    wall_start: float = field(default_factory=time.perf_counter)
    opened_at: str = field(default_factory=utc_now)
    collection: Collection | None = None
    traffic: Traffic = field(default_factory=Traffic)
    defences: dict[str, object] = field(default_factory=dict)
    guard: dict[str, object] = field(default_factory=dict)
    judgement: Judgement | None = None
    scores: dict[str, float] | None = None
    collect_s: float | None = None
    masked: bool = False
    masked_mean: np.ndarray | None = None

    def screen(
        self,
        robustness: RobustnessConfig,
        scores: Mapping[str, float],
        before: Iterable[str] = (),
    ) -> Screening:
        """Bound the accepted updates' norms and pull: record the decisions, move rejected out.

        An update rejected for its norm leaves ``collection.norms`` and is excluded as
        ``norm_bound``, with the sentence saying why; a kept one from a named suspect is set
        aside (:mod:`lensemble.federation.set_aside`: still a contributor, weight 0 in the
        mean); a kept one below the momentum floor is noted in ``shortfalls``
        (:func:`~lensemble.federation.robustness.lift_to_floor`).

        Args:
            robustness: ``federation.robustness``.
            scores: The suspicion scores of the last committed round (participant id -> score).
            before: Whom the last committed round set aside.
        """
        col = self.collection
        assert col is not None
        screening = decide(col.norms, robustness)
        if robustness.set_aside_suspects:
            screening.set_aside = set_aside(scores, screening.kept_ids, before)
            screening.kept_ids = [p for p in screening.kept_ids if p not in screening.set_aside]
        floor = robustness.momentum_cosine_floor
        screening.shortfalls = momentum_shortfalls(screening, col.cosines, floor)
        self.defences.update(screening.to_record())
        for pid, why in screening.rejected.items():
            col.norms.pop(pid)
            col.rejected[pid] = Reason.NORM_BOUND.value
            col.details[pid] = why
        return screening


@dataclass(frozen=True)
class RecordContext:
    """What every ledger record of a run says besides the attempt itself.

    Attributes:
        config_hash: The run's config hash.
        quantization: The pseudo-gradients' wire format.
        aggregator: ``federation.robustness.aggregator``.
    """

    config_hash: str
    quantization: str
    aggregator: str


def attempt_record(
    attempt: Attempt,
    context: RecordContext,
    *,
    parent_hash: str,
    new_hash: str,
    commit_s: float | None,
) -> RoundRecord:
    """The ledger record of an attempt; committed when ``new_hash`` differs from the parent.

    Args:
        attempt: The attempt, its collection and traffic set.
        context: The run's config hash, wire format and aggregator.
        parent_hash: The model the attempt started from.
        new_hash: The model it ends with (``parent_hash`` when aborted).
        commit_s: Seconds the previous commit's checkpoint and ledger line took, if known
            (``extra.previous_commit_s``).
    """
    col, traffic = attempt.collection, attempt.traffic
    assert col is not None
    contributors = col.contributors
    absent = sorted(col.expected - set(contributors))
    reported = {pid: col.reported[pid] for pid in contributors}
    losses = [r["mean_loss"] for r in reported.values() if r["mean_loss"] is not None]
    rejected = {
        pid: {"reason": col.rejected[pid], "detail": col.details.get(pid, "")}
        for pid in sorted(col.rejected)
        if pid in absent
    }
    defences = {**attempt.defences, "rejected": rejected}
    defences.setdefault("precommit", None)
    if col.opening.base_hash:  # federation.overlap: the updates' base, when not the parent
        defences["trained_from"] = col.opening.base_hash
    wall = time.perf_counter() - attempt.wall_start
    committed = new_hash != parent_hash
    return RoundRecord(
        round=attempt.machine.round_index,
        attempt=attempt.machine.attempt,
        state=(RoundState.CLOSED if committed else RoundState.ABORTED).value,
        contributors=contributors,
        excluded={pid: col.rejected.get(pid, "timeout") for pid in absent},
        parent_hash=parent_hash,
        model_hash=new_hash,
        mean_inner_loss=sum(losses) / len(losses) if losses else None,
        bytes_up=traffic.bytes_up,
        bytes_down=traffic.bytes_down,
        quantization=context.quantization,
        wall_s=round(wall, 6),
        compute_s=round(traffic.compute_s, 6),
        non_compute_s=round(max(0.0, wall - traffic.compute_s), 6),
        config_hash=context.config_hash,
        extra=_extra(attempt, commit_s),
        updates={p: {"hash": col.hashes[p], "bytes": col.sizes[p]} for p in contributors},
        aggregator=f"canonical-{context.aggregator}",
        software=f"lensemble {__version__}",
        opened_at=attempt.opened_at,
        closed_at=utc_now(),
        defences=defences,
        self_reported=reported,
        guard=dict(attempt.guard) if committed else {},
    )


def _extra(attempt: Attempt, commit_s: float | None) -> dict[str, float]:
    """The record's ``extra``: the previous commit's write time, this one's collection time."""
    extra = {} if commit_s is None else {"previous_commit_s": round(commit_s, 6)}
    if attempt.collect_s is not None:
        extra["collect_s"] = round(attempt.collect_s, 6)
    return extra
