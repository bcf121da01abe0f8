"""The coordinator: owns the global model and drives every round over any transport.

Per round ``t`` (docs/concepts.md#the-round; DiLoCo, arXiv 2311.08105, Algorithm 1):

1. OPEN: publish ``theta_t`` (a safetensors payload) and its hash.
2. COLLECTING: validate each submission as it arrives (:meth:`Coordinator.accept`) until every
   configured participant has one accepted, or ``round_timeout_s`` passes. A submission is
   rejected, never crashing the coordinator, when it comes from an unknown sender, targets another
   round or another attempt of this round (:func:`admit_attempt`, the one rule every transport
   applies), is corrupt, has another architecture, carries NaN/Inf, or conflicts with an earlier
   one.
3. With fewer than ``quorum`` contributors the attempt is ABORTED: nothing changes and the round is
   retried up to ``max_round_retries`` times, then the run stops with ``QuorumNotReached``.
4. AGGREGATING: each update's norm is bounded (clipped or rejected), then the updates are
   combined in sorted id order: float32 mean, or a coordinate-wise trimmed mean or median
   (``federation.robustness``, :mod:`lensemble.federation.robustness`, docs/security.md).
5. COMMITTING: the outer Nesterov SGD step and the pre-commit check of the new model (finite,
   bounded change; a failure aborts the attempt), the new model's hash (chained to its parent),
   an atomic checkpoint, then the ledger line. This is the only place global state changes.
   Under :meth:`Coordinator.run` the checkpoint and the ledger line are written behind: the
   next round opens while they are made durable on a commit thread, and that round cannot
   aggregate, abort or end the run before they are (docs/performance.md#write-behind-commits).

The coordinator judges submissions on one thread: transports hand them over one at a time.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, Protocol

import torch

from lensemble import __version__
from lensemble.config import LensembleConfig, config_hash
from lensemble.config.hashing import canonical_json, differing_paths, hashed_view
from lensemble.errors import (
    ArchitectureMismatch,
    ConfigError,
    IntegrityError,
    PayloadError,
    PrecommitCheckFailed,
    QuorumNotReached,
    ScaleOutOfRange,
)
from lensemble.federation.checkpoint import CheckpointStore, CoordinatorCheckpoint
from lensemble.federation.diloco import OuterStep
from lensemble.federation.intake import Intake
from lensemble.federation.ledger import Ledger, RoundRecord
from lensemble.federation.messages import Reason, RoundOpening, Submission, Verdict
from lensemble.federation.payload import (
    TensorSpec,
    bytes_hash,
    decode,
    encode,
    manifest,
    model_hash,
    model_hash_behind,
)
from lensemble.federation.quantization import dequantize, wire_specs
from lensemble.federation.residency import ALLOWED_METADATA, MAX_METADATA_VALUE
from lensemble.federation.robustness import (
    aggregate_spooled,
    decide,
    precommit_problem,
    update_norm,
)
from lensemble.federation.rounds import RoundMachine, RoundState
from lensemble.federation.signing import Signer, signer_from_env
from lensemble.federation.spool import UpdateSpool
from lensemble.federation.transport import CoordinatorTransport, Traffic
from lensemble.federation.verify import require_valid
from lensemble.machinery.flat import flat_copy, flat_empty, flat_zeros

Params = dict[str, torch.Tensor]

_log = logging.getLogger("lensemble.federation.coordinator")

#: Header bytes a pseudo-gradient payload may use: a base plus this much per tensor.
HEADER_BASE_BYTES = 8192
HEADER_BYTES_PER_TENSOR = 1024
#: Self-reported statistics the ledger keeps, with the range each must lie in (inclusive);
#: a value outside it, unparseable or not finite is recorded as null.
SELF_REPORTED_RANGES: dict[str, tuple[float, float]] = {
    "mean_loss": (-1e6, 1e6),
    "compute_s": (0.0, 1e6),
}
#: Longest rejection detail kept in the ledger (characters).
MAX_DETAIL = 240


def self_reported(metadata: Mapping[str, str]) -> dict[str, float | None]:
    """The statistics a participant reported about itself, bounded by :data:`SELF_REPORTED_RANGES`.

    Args:
        metadata: Payload metadata (strings, at most ``MAX_METADATA_VALUE`` characters each).

    Returns:
        Key -> value, or None when missing, unparseable, not finite or out of range.
    """
    out: dict[str, float | None] = {}
    for key, (low, high) in SELF_REPORTED_RANGES.items():
        try:
            value = float(metadata.get(key, "nan"))
        except ValueError:
            value = math.nan
        out[key] = value if math.isfinite(value) and low <= value <= high else None
    return out


class CoordinatorObserver(Protocol):
    """Optional callbacks for progress displays and metrics."""

    def on_state(self, round_index: int, attempt: int, state: RoundState) -> None:
        """A round attempt entered ``state``."""
        ...

    def on_verdict(self, submission: Submission, verdict: Verdict) -> None:
        """A submission was judged."""
        ...

    def on_round(self, record: RoundRecord) -> None:
        """A round attempt ended (committed or aborted)."""
        ...


def global_architecture(initial_params: Mapping[str, torch.Tensor]) -> dict[str, TensorSpec]:
    """The global model's tensor specs: the initial parameters' names and shapes, in float32.

    The coordinator keeps and sends the global model in float32 whatever ``model.dtype`` is
    (each participant trains in its own dtype); every transport checks payloads against this.

    Args:
        initial_params: ``theta_0``, name -> tensor of any floating dtype.
    """
    return manifest({k: v.to(torch.float32) for k, v in initial_params.items()})


@dataclass(frozen=True)
class ClosedAttempt:
    """The round attempt that closed last (committed or aborted) and what it counted.

    Attributes:
        round_index: Its round.
        attempt: Its attempt.
        accepted: Participant id -> ``sha256:<hex>`` payload hash of each update it accepted.
    """

    round_index: int
    attempt: int
    accepted: Mapping[str, str]


def admit_attempt(
    sender: str,
    round_index: int,
    attempt: int,
    payload_hash: str,
    *,
    opening: RoundOpening | None,
    closed: ClosedAttempt | None,
    current_round: int,
) -> Verdict | None:
    """The ``(round, attempt)`` admission rule, judged from a submission's header alone.

    The coordinator applies it to every submission; the network transport applies the same
    function before buffering a payload, so no transport admits what another refuses. An update
    trained for an attempt that is no longer open (an aborted attempt's late update included)
    is never counted in another attempt, even of the same round with the same base model.

    Args:
        sender: The authenticated participant id.
        round_index: Round the submission says it is for.
        attempt: Attempt the submission says it is for.
        payload_hash: ``sha256:<hex>`` the sender declared.
        opening: The attempt being collected, or None between attempts.
        closed: The attempt that closed last, or None.
        current_round: The round the coordinator is collecting (for the verdict).

    Returns:
        None when the submission targets the open attempt (its content is judged next); an
        accepted ``DUPLICATE`` verdict for a resend of an update already counted in the attempt
        that just closed (its reply was lost); otherwise a ``CLOSED_ROUND`` rejection.
    """
    key = (round_index, attempt)
    if opening is not None and key == (opening.round_index, opening.attempt):
        return None
    if (
        closed is not None
        and key == (closed.round_index, closed.attempt)
        and closed.accepted.get(sender) == payload_hash
    ):
        return Verdict(Reason.DUPLICATE, f"already counted in round {round_index}.", current_round)
    state = (
        f"round {opening.round_index} attempt {opening.attempt} is open"
        if opening is not None
        else "no round is open"
    )
    return Verdict(
        Reason.CLOSED_ROUND,
        f"round {round_index} attempt {attempt} is not being collected; {state}.",
        current_round,
    )


@dataclass
class _Collection:
    opening: RoundOpening
    expected: frozenset[str]
    # Accepted updates' L2 norms; the updates themselves wait in the coordinator's spool.
    norms: dict[str, float] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    reported: dict[str, dict[str, float | None]] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return self.expected <= set(self.norms)

    def targets(self, submission: Submission) -> bool:
        """True when ``submission`` is for this very attempt (not a stale or future one)."""
        key = (submission.round_index, submission.attempt)
        return key == (self.opening.round_index, self.opening.attempt)


@dataclass
class _PendingCommit:
    """A committed attempt whose checkpoint and ledger line are still being written."""

    machine: RoundMachine
    # Resolves to the seconds the checkpoint and the ledger append took; raises their error.
    written: Future[float]
    # Set once the durable line has been announced (or its failure logged).
    announced: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class RunSummary:
    """The outcome of :meth:`Coordinator.run`.

    Attributes:
        records: Every round attempt of this process, in order (resumed runs: since resume).
        model_hash: Hash of the final committed model.
        version: Final model version (= rounds committed).
        params: Final global parameters.
    """

    records: list[RoundRecord]
    model_hash: str
    version: int
    params: Params


class Coordinator:
    """Holds ``theta_t``, the outer momentum and the hash chain; commits rounds.

    Args:
        config: The run's config.
        initial_params: ``theta_0`` (name -> float32 tensor); also defines the architecture
            every submission must match.
        output_dir: Where checkpoints and the ledger go (None keeps everything in memory).
        resume: Continue from the latest checkpoint in ``output_dir`` when there is one.
        observer: Progress/metrics callbacks.
        signer: Signs ledger lines and checkpoints; ``"env"`` (default) takes the key the
            environment names (:func:`lensemble.federation.signing.signer_from_env`), None
            writes an unsigned record.

    A resume first verifies the whole run record (:func:`lensemble.federation.verify.
    require_valid`) and writes nothing before it holds; the caller holds the folder's lock
    (:func:`lensemble.run_lock.coordinator_lock`).

    Raises:
        ConfigError: Resuming a checkpoint written under a different config hash.
        IntegrityError: The run record to resume from is broken (names the line; exit 3), or
            ``signer`` is set and the record carries no MAC.
        UsageError: Resuming a signed record without a signer (exit 2; names the ledger and
            the key variable to set).
        DiskFull: The output folder has no room for the first checkpoint.
    """

    def __init__(
        self,
        config: LensembleConfig,
        initial_params: Mapping[str, torch.Tensor],
        *,
        output_dir: Path | None = None,
        resume: bool = False,
        observer: CoordinatorObserver | None = None,
        signer: Signer | Literal["env"] | None = "env",
    ) -> None:
        self.config = config
        self.config_hash = config_hash(config)
        fed = config.federation
        self.expected = frozenset(p.id for p in fed.participants)
        self.outer = OuterStep(
            fed.outer_optimizer.lr, fed.outer_optimizer.momentum, fed.outer_optimizer.nesterov
        )
        self.architecture = global_architecture(initial_params)
        wire = wire_specs(self.architecture, fed.quantization, fed.int8_chunk)
        self.max_header_bytes = HEADER_BASE_BYTES + HEADER_BYTES_PER_TENSOR * len(wire)
        self.observer = observer
        self.rejections: Counter[str] = Counter()
        # Every attempt decided by this process, in order; under run() the last commit may
        # still be being written until the next attempt (or run) settles it.
        self.records: list[RoundRecord] = []
        self._collection: _Collection | None = None
        self._closed: ClosedAttempt | None = None
        self._payload_cache: tuple[int, bytes] | None = None
        # The reduction's result, reused every round (allocated at the first aggregation).
        self._accumulator: Params | None = None
        self._commit_s: float | None = None  # checkpoint + ledger line of the last commit
        # Write-behind (run()): the commit being made durable while the next round collects.
        self._pending: _PendingCommit | None = None
        self._committer: ThreadPoolExecutor | None = None
        # Accepted updates wait on disk, not in memory, until their round closes (spool.py).
        self._spool = UpdateSpool(output_dir / "coordinator" / "spool" if output_dir else None)
        self._spool.reset()
        self.signer = (signer_from_env() if output_dir else None) if signer == "env" else signer
        self.checkpoints = CheckpointStore(output_dir, self.signer) if output_dir else None
        ledger_name = config.observability.ledger_path
        self.ledger = Ledger(output_dir / ledger_name, self.signer) if output_dir else None
        if output_dir is not None and resume:
            require_valid(output_dir, ledger_name, self.signer)  # before any work or write
        ckpt = self.checkpoints.load() if (self.checkpoints and resume) else None
        if ckpt is not None:
            self._restore(ckpt)
        else:
            # Model and momentum each live in one buffer (flat.py: huge pages, same values).
            params = flat_copy(initial_params)
            momentum = flat_zeros({k: v.shape for k, v in params.items()})
            self._set_state(0, params, momentum, model_hash(params, 0, ""), "")
            self._checkpoint_hash = self._save_checkpoint(record=None)

    # ------------------------------------------------------------------ state and persistence
    def _set_state(
        self, version: int, params: Params, momentum: Params, hash_: str, parent: str
    ) -> None:
        self.version, self.params, self.momentum = version, params, momentum
        self.model_hash, self.parent_hash = hash_, parent

    def _restore(self, ckpt: CoordinatorCheckpoint) -> None:
        if ckpt.config_hash != self.config_hash:
            # Only the number of rounds may change on resume (run longer, or stop earlier).
            try:
                previous = json.loads(ckpt.config_view)
            except ValueError:
                previous = None
            changed = (
                differing_paths(previous, hashed_view(self.config))
                if isinstance(previous, dict)
                else ["(unknown: the checkpoint does not record its config)"]
            )
            changed = [path for path in changed if path != "federation.rounds"]
            if changed:
                raise ConfigError(
                    f"the checkpoint in {self.checkpoints.folder if self.checkpoints else ''} "
                    f"was written with another config (differing: {', '.join(changed)}); "
                    "resume with the same config (only federation.rounds may change) or use a "
                    "new run.output_dir."
                )
        self._set_state(
            ckpt.version,
            flat_copy(ckpt.params),
            flat_copy(ckpt.momentum),
            ckpt.model_hash,
            ckpt.parent_hash,
        )
        if self.ledger is not None:
            self._repair_ledger()

    def _repair_ledger(self) -> None:
        """Drop the lines of attempts after the checkpoint (the resume redoes that round).

        The lost or torn line of the checkpoint's own round was restored by ``require_valid``.
        """
        assert self.ledger is not None
        lines = self.ledger.lines()
        kept = [line for line in lines if line.record.round < self.version]
        if len(kept) != len(lines):
            dropped = len(lines) - len(kept)
            self.ledger.rewrite_texts(
                (line.text for line in kept),
                why=f"drops its last {dropped} line(s), attempts of round {self.version} after "
                f"checkpoint v{self.version} (the resume redoes that round)",
            )
        if self.version > 0 and not any(
            line.record.round == self.version - 1 and line.record.state == "closed" for line in kept
        ):
            raise IntegrityError(
                f"the ledger lacks round {self.version - 1}, which the checkpoint commits;",
                remediation="run `lensemble verify` on the folder; use a new run.output_dir.",
            )

    def _save_checkpoint(self, record: RoundRecord | None) -> str | None:
        if self.checkpoints is None:
            return None
        return self.checkpoints.save(self._checkpoint_of(record))

    def _checkpoint_of(self, record: RoundRecord | None) -> CoordinatorCheckpoint:
        # The tensors are referenced, not copied: nothing changes them before the commit is
        # settled (the next outer step waits for it).
        return CoordinatorCheckpoint(
            self.version,
            self.params,
            self.momentum,
            self.model_hash,
            self.parent_hash,
            self.config_hash,
            canonical_json(hashed_view(self.config)).decode(),
            record.to_json() if record else "",
        )

    def _write_commit(self, record: RoundRecord, ckpt: CoordinatorCheckpoint | None) -> float:
        """Checkpoint, then ledger line (the order a resume relies on); returns seconds."""
        start = time.perf_counter()
        checkpoint = self.checkpoints.save(ckpt) if (self.checkpoints and ckpt) else None
        if self.ledger is not None:
            self.ledger.append(record, checkpoint)
        return time.perf_counter() - start

    def _write_behind(
        self, record: RoundRecord, machine: RoundMachine, transport: CoordinatorTransport
    ) -> None:
        """Hand a committed attempt's checkpoint and ledger line to the commit thread.

        The transport stops collecting at once (as after a synchronous commit), so the next
        round can open, and the record joins ``records`` (the attempts decided so far). The
        transport's ``round_durable`` and the observer's ``on_round`` hear of it from the commit
        thread once its line is durable; :meth:`_settle` waits for that.
        """
        if self._committer is None:
            self._committer = ThreadPoolExecutor(1, thread_name_prefix="lensemble-commit")
        ckpt = self._checkpoint_of(record) if self.checkpoints else None
        pending = _PendingCommit(machine, self._committer.submit(self._write_commit, record, ckpt))
        self._pending = pending
        self.records.append(record)
        transport.round_closed(record)

        def written(future: Future[float]) -> None:  # on the commit thread, once it is done
            try:
                if future.exception() is None:
                    self._announce_durable(record, transport)
                else:
                    _log.error(
                        "the checkpoint or ledger line of round %d failed (%s); the run stops "
                        "once the round now collecting ends, and a resume redoes round %d.",
                        record.round,
                        future.exception(),
                        record.round,
                    )
            finally:
                pending.announced.set()

        pending.written.add_done_callback(written)

    def _announce_durable(self, record: RoundRecord, transport: CoordinatorTransport) -> None:
        """Tell the transport and the observer that ``record``'s line is durable.

        Under write-behind this runs on the commit thread (observers must be thread-safe;
        the network coordinator's log and metrics are).
        """
        transport.round_durable(record)
        if self.observer is not None:
            self.observer.on_round(record)

    def _commit_failed(self) -> bool:
        """True once a commit written behind has failed (collection may stop early)."""
        pending = self._pending
        return (
            pending is not None
            and pending.written.done()
            and (pending.written.exception() is not None)
        )

    def _settle(self, *, last: bool = False) -> None:
        """Wait until the commit written behind is durable; re-raise its error.

        Args:
            last: No other attempt opened since, so the observer hears that it CLOSED (a
                later round's state would be overwritten by a late CLOSED otherwise).

        Raises:
            DiskFull, OSError, IntegrityError: Whatever the checkpoint or the ledger append
                raised; the round is then not committed and a resume redoes it.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return
        self._commit_s = pending.written.result()
        pending.announced.wait()  # the durable line's announcement, made on the commit thread
        pending.machine.advance(RoundState.CLOSED)
        if last:
            self._notify(pending.machine)

    def _settle_after_failure(self) -> None:
        """Wait for the commit behind while another error ends the run; log, never mask it."""
        try:
            self._settle(last=True)
        except Exception as exc:  # the error already propagating is the one to report
            _log.error("the commit of the previous round failed as well: %s", exc)

    def model_payload(self) -> bytes:
        """The current global model as a safetensors payload (cached per version)."""
        if self._payload_cache is None or self._payload_cache[0] != self.version:
            data = encode(
                self.params,
                {
                    "kind": "global-model",
                    "version": str(self.version),
                    "model_hash": self.model_hash,
                    "parent_hash": self.parent_hash,
                },
            )
            self._payload_cache = (self.version, data)
        return self._payload_cache[1]

    # -------------------------------------------------------------------------- submissions
    @property
    def collecting_round(self) -> int:
        """The round being collected, or the next one when none is open."""
        return self._collection.opening.round_index if self._collection else self.version

    @property
    def intake(self) -> Intake:
        """The door a transport's receiving threads may use: spool files to land updates in.

        Thread-safe; see :mod:`lensemble.federation.intake`. A submission carrying a landing
        (``Submission.landed``) is kept in that file when accepted, without another write.
        """
        return Intake(self._spool.land)

    def accept(self, submission: Submission) -> Verdict:
        """Validate one submission for the open round and keep it if valid.

        Never raises on bad input: every problem becomes a rejection with a reason. Should
        judging itself fail on some input nobody foresaw (a bug), a last-resort guard logs it
        and rejects the submission as ``bad_payload`` instead of letting the coordinator die;
        judging changes no state until the submission is accepted, so nothing is half-done. A
        byte-identical resend of an accepted submission is accepted again without effect.

        Returns:
            The verdict (also counted in ``self.rejections`` when rejected).
        """
        try:
            verdict = self._judge(submission)
        except Exception as exc:  # the last-resort guard: reject, never die
            _log.error(
                "judging a submission raised %s; rejected as bad_payload (a bug, please report)",
                type(exc).__name__,
                exc_info=True,
            )
            verdict = self._verdict(
                Reason.BAD_PAYLOAD, f"the payload could not be judged ({type(exc).__name__})."
            )
        if not verdict.accepted:
            self.rejections[verdict.reason.value] += 1
            col = self._collection
            # Only a rejection of an update for this attempt explains an exclusion from it.
            if col and submission.sender in col.expected and col.targets(submission):
                col.rejected[submission.sender] = verdict.reason.value
                col.details[submission.sender] = verdict.message[:MAX_DETAIL]
        if self.observer is not None:
            self.observer.on_verdict(submission, verdict)
        return verdict

    def _verdict(self, reason: Reason, message: str) -> Verdict:
        return Verdict(reason, message, self.collecting_round)

    def _judge(self, sub: Submission) -> Verdict:
        col = self._collection
        if sub.sender not in self.expected:
            return self._verdict(
                Reason.UNKNOWN_PARTICIPANT, f"'{sub.sender}' is not a participant of this run."
            )
        early = admit_attempt(
            sub.sender,
            sub.round_index,
            sub.attempt,
            sub.payload_hash,
            opening=col.opening if col else None,
            closed=self._closed,
            current_round=self.collecting_round,
        )
        if early is not None:
            return early
        assert col is not None  # admit_attempt admits only into the open attempt
        # The network transport hashed the bytes while they streamed in and compared them.
        digest = sub.payload_hash if sub.hash_checked else bytes_hash(sub.payload)
        if digest != sub.payload_hash:
            return self._verdict(
                Reason.HASH_MISMATCH,
                f"payload hashes to {digest[:19]}..., the sender declared "
                f"{sub.payload_hash[:19]}...",
            )
        if sub.sender in col.hashes:
            if col.hashes[sub.sender] == digest:
                return self._verdict(Reason.DUPLICATE, "duplicate of an accepted submission.")
            return self._verdict(
                Reason.CONFLICTING_DUPLICATE,
                f"'{sub.sender}' already submitted different bytes for round {sub.round_index}.",
            )
        try:
            # Views of the payload, no copy: judging only reads them.
            decoded = decode(sub.payload, max_header_bytes=self.max_header_bytes, copy=False)
        except PayloadError as exc:
            return self._verdict(Reason.BAD_PAYLOAD, exc.message)
        meta = decoded.metadata
        for key in sorted(meta):
            if key != "format" and key not in ALLOWED_METADATA:
                return self._verdict(
                    Reason.BAD_PAYLOAD, f"payload metadata '{key[:64]}' is not allowed."
                )
            if len(meta[key]) > MAX_METADATA_VALUE:
                return self._verdict(
                    Reason.BAD_PAYLOAD,
                    f"payload metadata '{key}' is {len(meta[key])} characters long, more than "
                    f"{MAX_METADATA_VALUE}.",
                )
        fed = self.config.federation
        expected_meta = {
            "kind": "pseudo-gradient",
            "round": str(col.opening.round_index),
            "attempt": str(col.opening.attempt),
            "participant": sub.sender,
            "quantization": fed.quantization,
            "int8_chunk": str(fed.int8_chunk),
        }
        for key, value in expected_meta.items():
            if meta.get(key) != value:
                # Only a well-formed other round or attempt is a closed one; missing or garbled
                # round metadata is a malformed payload (issue 41).
                number = meta.get(key, "")
                other = key in ("round", "attempt") and number.isascii() and number.isdigit()
                reason = Reason.CLOSED_ROUND if other else Reason.BAD_PAYLOAD
                return self._verdict(
                    reason, f"payload field '{key}' is {meta.get(key)!r}, expected {value!r}."
                )
        if meta.get("base_hash") != col.opening.model_hash:
            return self._verdict(
                Reason.STALE_BASE,
                "the pseudo-gradient was computed from another global model; fetch the current "
                "one.",
            )
        try:
            delta = dequantize(
                decoded.tensors,
                self.architecture,
                fed.quantization,
                fed.int8_chunk,
                max_scale=fed.robustness.max_int8_scale,
            )
        except ArchitectureMismatch as exc:
            return self._verdict(Reason.ARCHITECTURE_MISMATCH, str(exc))
        except ScaleOutOfRange as exc:
            return self._verdict(Reason.OUT_OF_BOUNDS, exc.message)
        except PayloadError as exc:
            return self._verdict(Reason.NON_FINITE, exc.message)
        col.norms[sub.sender] = update_norm(delta)
        self._spool.add(sub.sender, sub.payload, digest, decoded, sub.landed)
        col.hashes[sub.sender] = digest
        col.sizes[sub.sender] = len(sub.payload)
        col.reported[sub.sender] = self_reported(meta)
        col.rejected.pop(sub.sender, None)
        col.details.pop(sub.sender, None)
        return self._verdict(Reason.ACCEPTED, "accepted.")

    # -------------------------------------------------------------------------------- rounds
    def _notify(self, machine: RoundMachine) -> None:
        if self.observer is not None:
            self.observer.on_state(machine.round_index, machine.attempt, machine.state)

    def _advance(self, machine: RoundMachine, state: RoundState) -> None:
        machine.advance(state)
        self._notify(machine)

    def run(self, transport: CoordinatorTransport) -> RunSummary:
        """Run rounds until ``federation.rounds`` are committed.

        Raises:
            QuorumNotReached: Fewer than ``quorum`` participants joined within
                ``join_timeout_s``, or a round stayed below quorum after every retry.
        """
        fed = self.config.federation
        if self.version >= fed.rounds:  # resumed a finished run: nothing to wait for
            transport.finish()
            return RunSummary(list(self.records), self.model_hash, self.version, self.params)
        joined = transport.wait_for_participants(fed.quorum, fed.join_timeout_s)
        if len(joined) < fed.quorum:
            raise QuorumNotReached(
                f"only {len(joined)} of {len(self.expected)} participants joined within "
                f"federation.join_timeout_s ({fed.join_timeout_s} s); quorum is {fed.quorum}.",
                remediation="start more participants, check their logs, or lower "
                "federation.quorum.",
            )
        try:
            while self.version < fed.rounds:
                self.run_round(transport, write_behind=True)
            self._settle(last=True)
        except BaseException:
            self._settle_after_failure()
            raise
        finally:
            if self._committer is not None:
                self._committer.shutdown(wait=True)
                self._committer = None
        transport.finish()
        return RunSummary(list(self.records), self.model_hash, self.version, self.params)

    def run_round(
        self, transport: CoordinatorTransport, *, write_behind: bool = False
    ) -> RoundRecord:
        """Run round ``self.version`` with retries; returns its committed record.

        Args:
            transport: Where the round's model goes and its updates come from.
            write_behind: Leave the checkpoint and ledger line of the commit to the commit
                thread (:meth:`run` does; the next attempt settles it). False returns with
                both durable.

        Raises:
            QuorumNotReached: Still below quorum after ``max_round_retries`` retries.
        """
        fed = self.config.federation
        transport.attach(self.intake)
        record = None
        for attempt in range(fed.max_round_retries + 1):
            record = self.run_attempt(transport, attempt, write_behind=write_behind)
            if record.state == RoundState.CLOSED:
                return record
        assert record is not None
        if record.defences.get("precommit"):
            raise PrecommitCheckFailed(
                f"round {record.round}'s new global model failed the pre-commit check in "
                f"{fed.max_round_retries + 1} attempts: {record.defences['precommit']}",
                remediation="see the ledger's defences field for the updates' norms; tighten "
                "federation.robustness (norm_bound, median_factor, aggregator) or exclude the "
                "participant.",
            )
        raise QuorumNotReached(
            f"round {record.round} reached only {len(record.contributors)} of "
            f"{fed.quorum} required contributors in {fed.max_round_retries + 1} attempts "
            f"(excluded: {', '.join(f'{k}={v}' for k, v in sorted(record.excluded.items()))}).",
            remediation="check the excluded participants' logs, raise "
            "federation.round_timeout_s, or lower federation.quorum.",
        )

    def run_attempt(
        self, transport: CoordinatorTransport, attempt: int, *, write_behind: bool = False
    ) -> RoundRecord:
        """One attempt at round ``self.version``: open, collect, and commit or abort.

        A commit written behind by the previous attempt is settled once collection ends,
        before this attempt aggregates, aborts or writes anything (:meth:`_settle`).
        """
        fed = self.config.federation
        t = self.version
        machine = RoundMachine(t, attempt)
        self._notify(machine)
        wall_start = time.perf_counter()
        opened_at = _utc_now()
        opening = RoundOpening(
            round_index=t,
            attempt=attempt,
            model_version=self.version,
            model_hash=self.model_hash,
            deadline_s=transport.now() + fed.round_timeout_s,
        )
        col = _Collection(opening, self.expected)
        self._collection = col
        self._spool.reset()
        transport.open_round(opening, self.model_payload())
        self._advance(machine, RoundState.COLLECTING)
        while not col.complete:
            submission = transport.receive(opening.deadline_s)
            if submission is None:
                break
            transport.reply(submission, self.accept(submission))
            del submission  # its payload is spilled: let it go before the next one arrives
            if self._commit_failed():
                break  # the previous round is not durable: _settle raises why
        # The previous round must be durable before this one can change anything.
        self._settle()
        # A transport may know why an absent participant is absent (its connection broke, it
        # sent an oversized stream): the ledger names that instead of "timeout".
        for pid, why in transport.absence_reasons().items():
            col.rejected.setdefault(pid, why)
        self._collection = None
        self._closed = ClosedAttempt(t, attempt, dict(col.hashes))
        traffic = transport.take_traffic()
        parent = self.model_hash
        defences: dict[str, object] = {"aggregator": fed.robustness.aggregator}
        if len(col.norms) < fed.quorum:
            self._spool.reset()
            return self._abort(
                machine, col, traffic, wall_start, opened_at, defences=defences, transport=transport
            )
        self._advance(machine, RoundState.AGGREGATING)
        screening = decide(col.norms, fed.robustness)
        defences.update(screening.to_record())
        for pid, why in screening.rejected.items():
            col.norms.pop(pid)
            col.rejected[pid] = Reason.NORM_BOUND.value
            col.details[pid] = why
        if len(col.norms) < fed.quorum:
            self._spool.reset()
            return self._abort(
                machine, col, traffic, wall_start, opened_at, defences=defences, transport=transport
            )
        shapes = {name: spec.shape for name, spec in self.architecture.items()}
        if self._accumulator is None:
            self._accumulator = flat_empty(shapes)
        try:
            combined = aggregate_spooled(
                self._spool,
                screening,
                shapes,
                fed.robustness,
                scheme=fed.quantization,
                chunk=fed.int8_chunk,
                out=self._accumulator,
            )
        finally:
            self._spool.reset()
        self._advance(machine, RoundState.COMMITTING)
        # The check reads the new model tensor by tensor; only when it passes is the step
        # taken, in place: no second copy of the model and its momentum is ever held. Each
        # checked tensor is hashed on the hashing thread meanwhile, so the new model's hash is
        # ready with the step; its tensors are the step's bit for bit (OuterStep.candidate).
        params, momentum = self.params, self.momentum
        with model_hash_behind(self.version + 1, parent) as hasher:
            candidate = self.outer.candidate(params, combined, momentum)
            change, problem = precommit_problem(
                params, candidate, fed.robustness.max_relative_change, on_checked=hasher.add
            )
            defences["relative_change"] = float(f"{change:.6g}") if change is not None else None
            if problem is not None:
                defences["precommit"] = problem
                return self._abort(
                    machine,
                    col,
                    traffic,
                    wall_start,
                    opened_at,
                    defences=defences,
                    transport=transport,
                )
            self._payload_cache = None  # the committed model's payload replaces it
            self.outer.apply_in_place(params, combined, momentum)
            del combined
            new_hash = hasher.result(sorted(params))
        record = self._record(
            machine,
            col,
            traffic,
            wall_start,
            opened_at=opened_at,
            defences=defences,
            new_hash=new_hash,
        )
        self._set_state(self.version + 1, params, momentum, new_hash, parent)
        if write_behind:
            self._write_behind(record, machine, transport)
            return record
        commit_start = time.perf_counter()
        checkpoint = self._save_checkpoint(record)
        self._advance(machine, RoundState.CLOSED)
        self._finish(record, transport, checkpoint=checkpoint)
        # The line cannot time its own checkpoint and append; the next line reports them.
        self._commit_s = time.perf_counter() - commit_start
        return record

    def _abort(
        self,
        machine: RoundMachine,
        col: _Collection,
        traffic: Traffic,
        wall_start: float,
        opened_at: str,
        *,
        defences: dict[str, object],
        transport: CoordinatorTransport,
    ) -> RoundRecord:
        """End an attempt without changing global state (below quorum, or pre-commit failed)."""
        self._advance(machine, RoundState.ABORTED)
        record = self._record(
            machine,
            col,
            traffic,
            wall_start,
            opened_at=opened_at,
            defences=defences,
            new_hash=self.model_hash,
        )
        self._finish(record, transport, checkpoint=None)
        return record

    def _record(
        self,
        machine: RoundMachine,
        col: _Collection,
        traffic: Traffic,
        wall_start: float,
        *,
        opened_at: str,
        defences: dict[str, object],
        new_hash: str,
    ) -> RoundRecord:
        """The ledger line of an attempt; committed when ``new_hash`` differs from the parent."""
        contributors = sorted(col.norms)
        absent = sorted(self.expected - set(contributors))
        committed = new_hash != self.model_hash
        reported = {pid: col.reported[pid] for pid in contributors}
        losses = [r["mean_loss"] for r in reported.values() if r["mean_loss"] is not None]
        rejected = {
            pid: {"reason": col.rejected[pid], "detail": col.details.get(pid, "")}
            for pid in sorted(col.rejected)
            if pid in absent
        }
        defences = {**defences, "rejected": rejected}
        defences.setdefault("precommit", None)
        wall = time.perf_counter() - wall_start
        extra = {} if self._commit_s is None else {"previous_commit_s": round(self._commit_s, 6)}
        return RoundRecord(
            round=machine.round_index,
            attempt=machine.attempt,
            state=(RoundState.CLOSED if committed else RoundState.ABORTED).value,
            contributors=contributors,
            excluded={pid: col.rejected.get(pid, "timeout") for pid in absent},
            parent_hash=self.model_hash,
            model_hash=new_hash,
            mean_inner_loss=sum(losses) / len(losses) if losses else None,
            bytes_up=traffic.bytes_up,
            bytes_down=traffic.bytes_down,
            quantization=self.config.federation.quantization,
            wall_s=round(wall, 6),
            compute_s=round(traffic.compute_s, 6),
            non_compute_s=round(max(0.0, wall - traffic.compute_s), 6),
            config_hash=self.config_hash,
            extra=extra,
            updates={p: {"hash": col.hashes[p], "bytes": col.sizes[p]} for p in contributors},
            aggregator=f"canonical-{self.config.federation.robustness.aggregator}",
            software=f"lensemble {__version__}",
            opened_at=opened_at,
            closed_at=_utc_now(),
            defences=defences,
            self_reported=reported,
        )

    def _finish(
        self, record: RoundRecord, transport: CoordinatorTransport, *, checkpoint: str | None
    ) -> None:
        if self.ledger is not None:
            self.ledger.append(record, checkpoint)
        self.records.append(record)
        transport.round_closed(record)
        self._announce_durable(record, transport)


def _utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
