"""The coordinator: owns the global model and drives every round over any transport.

Per round ``t`` (docs/concepts.md#the-round; DiLoCo, arXiv 2311.08105, Algorithm 1):

1. OPEN: publish ``theta_t`` (a safetensors payload) and its hash.
2. COLLECTING: validate each submission as it arrives (:meth:`Coordinator.accept`,
   :mod:`lensemble.federation.admission`) until every configured participant has one accepted,
   or ``round_timeout_s`` passes, or quorum has submitted and the rest are stragglers
   (:mod:`lensemble.federation.stragglers`).
3. With fewer than ``quorum`` contributors the attempt is ABORTED: nothing changes and the round is
   retried up to ``max_round_retries`` times, then the run stops with ``QuorumNotReached``.
4. AGGREGATING: each update's norm is bounded (clipped or rejected), then the updates are
   combined in sorted id order (but those of participants the suspicion scores of the last
   commit name: :mod:`lensemble.federation.set_aside`): float32 mean, or a coordinate-wise
   trimmed mean or median, less each update's pull against the outer momentum beyond the floor
   (``federation.robustness``, :mod:`lensemble.federation.robustness`, docs/security.md). Each
   contributor's history score is updated (:mod:`lensemble.federation.suspicion`) and the
   divergence guard judges the round's model from the contributors' held-out reports
   (:mod:`lensemble.federation.guard`); when it rolls back, the round does not aggregate.
5. COMMITTING: the outer Nesterov SGD step behind the pre-commit check of the new model (finite,
   bounded change; a failure aborts the attempt; :mod:`lensemble.federation.commit`), or the
   best judged model and its momentum again (a rollback), the new model's hash (chained to its
   parent), an atomic checkpoint, then the ledger line
   (:mod:`lensemble.federation.coordinator_store`). This is the only place global state
   changes. Under :meth:`Coordinator.run` the checkpoint and the ledger line are written
   behind: the next round opens while they are made durable on a commit thread, and that round
   cannot aggregate, abort or end the run before they are
   (docs/performance.md#write-behind-commits).

:meth:`Coordinator.run` is the one round loop: every run (the in-process simulation, the network
coordinator) drives it, and differs only in its transport and what it does after each commit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import torch

from lensemble.config import LensembleConfig
from lensemble.errors import QuorumNotReached
from lensemble.federation.admission import Admission
from lensemble.federation.attempt import Attempt, RecordContext, attempt_record
from lensemble.federation.central_privacy import CentralPrivacy
from lensemble.federation.commit import Committer, outer_step, scheduled
from lensemble.federation.coordinator_store import (
    CommittedModel,
    CoordinatorStore,
    ModelState,
    model_payload_of,
)
from lensemble.federation.defence_history import DefenceHistory
from lensemble.federation.diloco import OuterStep
from lensemble.federation.final_model import FinalModel, KeptModel
from lensemble.federation.intake import Intake
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.masked_round import collect_masked, retry_possible
from lensemble.federation.masking import unflatten_into
from lensemble.federation.messages import RoundOpening, Submission, Verdict
from lensemble.federation.overlap import round_base_hash
from lensemble.federation.payload import TensorSpec, manifest, model_hash
from lensemble.federation.resume_record import coordinator_signer, record_to_resume
from lensemble.federation.robustness import Screening, aggregate_spooled, lift_to_floor
from lensemble.federation.round_failure import round_failed
from lensemble.federation.rounds import RoundMachine, RoundState
from lensemble.federation.signing import Signer
from lensemble.federation.spool import UpdateSpool
from lensemble.federation.stragglers import Stragglers
from lensemble.federation.transport import CoordinatorTransport
from lensemble.federation.verify import VerifiedRecord
from lensemble.machinery.flat import flat_copy, flat_empty, flat_zeros

Params = dict[str, torch.Tensor]

_log = logging.getLogger("lensemble.federation.coordinator")


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
class RunSummary:
    """The outcome of :meth:`Coordinator.run`.

    Attributes:
        records: Every round attempt of this process, in order (resumed runs: since resume).
        model_hash: Hash of the final committed model.
        version: Final model version (= rounds committed).
        params: Final global parameters.
        stopped: Why the run ended before ``federation.rounds`` (the central privacy budget
            was spent), or None.
        kept: Under ``federation.final_model: best_reported``, the committed version the run
            ends with and why (:mod:`lensemble.federation.final_model`); None under ``last``.
    """

    records: list[RoundRecord]
    model_hash: str
    version: int
    params: Params
    stopped: str | None = None
    kept: KeptModel | None = None


class Coordinator(CommittedModel):
    """Holds ``theta_t``, the outer momentum and the hash chain; commits rounds.

    Args:
        config: The run's config.
        initial_params: ``theta_0`` (name -> float32 tensor); also defines the architecture
            every submission must match.
        output_dir: Where checkpoints and the ledger go (None keeps everything in memory).
        resume: Continue from the latest checkpoint in ``output_dir`` when there is one: True
            verifies the run record first, a :class:`~lensemble.federation.verify.
            VerifiedRecord` is the record the caller verified (nothing is read or checked
            again).
        observer: Progress/metrics callbacks.
        signer: Signs ledger lines and checkpoints; ``"env"`` (default) takes the key the
            verified record was checked with, else the one the environment names
            (:func:`lensemble.federation.signing.signer_from_env`); None writes an unsigned
            record.
        central_noise_seed: The coordinator's secret seed of its central-privacy noise
            (``federation.central_privacy`` under plain aggregation; the network coordinator
            derives it from its TLS key); None derives it from the run seed (the simulation).

    A resume verifies the whole run record once (:func:`lensemble.federation.verify.
    require_valid`) and writes nothing before it holds; the caller holds the folder's lock
    (:func:`lensemble.run_lock.coordinator_lock`).

    Raises:
        ConfigError: Resuming a checkpoint written under a different config hash, or a
            verified record of another folder or key.
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
        resume: bool | VerifiedRecord = False,
        observer: CoordinatorObserver | None = None,
        signer: Signer | Literal["env"] | None = "env",
        central_noise_seed: int | None = None,
    ) -> None:
        self.config = config
        fed = config.federation
        self.outer = OuterStep(
            fed.outer_optimizer.lr, fed.outer_optimizer.momentum, fed.outer_optimizer.nesterov
        )
        self.architecture = global_architecture(initial_params)
        # The records of attempts before this process (a resume's ledger, up to its checkpoint).
        self.earlier: list[RoundRecord] = []
        self._payload_cache: tuple[int, bytes] | None = None
        # The reduction's result, reused every round (allocated at the first aggregation).
        self._accumulator: Params | None = None
        # Accepted updates wait on disk, not in memory, until their round closes (spool.py).
        self._spool = UpdateSpool(output_dir / "coordinator" / "spool" if output_dir else None)
        self._spool.reset()
        self.admission = Admission(
            fed, self.architecture, self._spool, lambda: self.version, observer
        )
        self.admission.reference = lambda: self.momentum  # for each update's cosine
        self.signer = coordinator_signer(signer, resume, output_dir)
        self.store = CoordinatorStore(config, output_dir, self.signer)
        self.config_hash = self.store.config_hash
        # Suspicion scores, the divergence guard and its best model (replayed on resume).
        self.defences = DefenceHistory(fed.robustness, self.store)
        self.final = FinalModel(fed, self.store)  # which version the run ends with
        self._context = RecordContext(self.config_hash, fed.quantization, fed.robustness.aggregator)
        self.committer = Committer(self.store, observer)
        # This process's attempts, in order (run(): the last commit may still be being written).
        self.records = self.committer.records
        self.observer = observer
        self._start(initial_params, output_dir, resume)
        # User-level DP of the committed models (DP-FedAvg), if on.
        self.central = CentralPrivacy.of(config, self.earlier, central_noise_seed)

    def _start(
        self,
        initial_params: Mapping[str, torch.Tensor],
        output_dir: Path | None,
        resume: bool | VerifiedRecord,
    ) -> None:
        """Resume from the verified newest checkpoint, or start from ``theta_0``."""
        verified = None
        if output_dir is not None and resume:
            verified = record_to_resume(resume, output_dir, self.config, self.signer)
        latest = verified.take_latest() if verified is not None else None
        if verified is not None and latest is not None:
            self.state, self.earlier = self.store.restore(latest, verified)
            self.defences.replay(self.earlier)
            self.final.replay([r for r in self.earlier if r.state == "closed"])
            return
        # Model and momentum each live in one buffer (flat.py: huge pages, same values).
        params = flat_copy(initial_params)
        momentum = flat_zeros({k: v.shape for k, v in params.items()})
        self.state = ModelState(0, params, momentum, model_hash(params, 0, ""), "")
        self.store.save(self.state, record=None)

    # ------------------------------------------------------------------------------ state
    @property
    def observer(self) -> CoordinatorObserver | None:
        """Who hears of states, verdicts and durable lines (settable until a run starts)."""
        return self._observer

    @observer.setter
    def observer(self, observer: CoordinatorObserver | None) -> None:
        self._observer = self.admission.observer = self.committer.observer = observer

    @property
    def history(self) -> list[RoundRecord]:
        """Every attempt of the run: those before a resume, then this process's."""
        return self.earlier + self.records

    def model_payload(self) -> bytes:
        """The current global model as a safetensors payload (cached per version)."""
        if self._payload_cache is None or self._payload_cache[0] != self.version:
            self._payload_cache = (self.version, model_payload_of(self.state))
        return self._payload_cache[1]

    # -------------------------------------------------------------------------- submissions
    @property
    def intake(self) -> Intake:
        """The door a transport's receiving threads may use: spool files to land updates in.

        Thread-safe; see :mod:`lensemble.federation.intake`. A submission carrying a landing
        (``Submission.landed``) is kept in that file when accepted, without another write.
        """
        return Intake(self._spool.land)

    def accept(self, submission: Submission) -> Verdict:
        """Judge one submission for the open attempt (:meth:`Admission.accept`); never raises."""
        return self.admission.accept(submission)

    # -------------------------------------------------------------------------------- rounds
    def _notify(self, machine: RoundMachine) -> None:
        if self.observer is not None:
            self.observer.on_state(machine.round_index, machine.attempt, machine.state)

    def _advance(self, machine: RoundMachine, state: RoundState) -> None:
        machine.advance(state)
        self._notify(machine)

    def run(
        self,
        transport: CoordinatorTransport,
        *,
        after_commit: Callable[[RoundRecord], None] | None = None,
    ) -> RunSummary:
        """Run rounds until ``federation.rounds`` are committed: the one loop every run drives.

        Args:
            transport: Where each round's model goes and its updates come from.
            after_commit: Called on this thread with each committed round's record, before the
                next round opens, while ``params``, ``version`` and ``model_hash`` are that
                round's model (they change only at the next outer step, after the commit
                written behind is settled). The record's checkpoint and ledger line may still
                be being written; an error it raises ends the run once they are durable.

        Raises:
            QuorumNotReached: Fewer than ``quorum`` participants joined within
                ``join_timeout_s``, or a round stayed below quorum after every retry.
        """
        fed = self.config.federation
        stopped = None
        if self.version < fed.rounds:  # a resumed finished run has nothing to wait for
            _wait_for_quorum(transport, self.config, len(self.admission.expected))
            try:
                while self.version < fed.rounds:
                    stopped = self.central.refusal(self.version) if self.central else None
                    if stopped is not None:
                        break
                    record = self.run_round(transport, write_behind=True)
                    if after_commit is not None:
                        after_commit(record)
                self._settle(last=True)
            except BaseException:
                self._settle_after_failure()
                raise
            finally:
                self.committer.shutdown()
        transport.finish()
        kept = self.final.choose(self.state)
        return RunSummary(
            list(self.records), self.model_hash, self.version, self.params, stopped, kept
        )

    def run_round(
        self, transport: CoordinatorTransport, *, write_behind: bool = False
    ) -> RoundRecord:
        """Run round ``self.version`` with retries; returns its committed record.

        One step of :meth:`run`.

        Args:
            transport: Where the round's model goes and its updates come from.
            write_behind: Leave the checkpoint and ledger line of the commit to the commit
                thread (:meth:`run` does; the next attempt settles it). False returns with
                both durable.

        Raises:
            QuorumNotReached, PrecommitCheckFailed: No attempt committed (:func:`round_failed`).
        """
        fed = self.config.federation
        transport.attach(self.intake)
        record = None
        for attempt in range(fed.max_round_retries + 1):
            record = self.run_attempt(transport, attempt, write_behind=write_behind)
            if record.state == RoundState.CLOSED:
                return record
            if not retry_possible(self.config, self.history, record.round):  # masking: signed
                raise round_failed(record, fed.quorum, attempt + 1, signed_out=True)
        assert record is not None
        raise round_failed(record, fed.quorum, fed.max_round_retries + 1)

    def run_attempt(
        self, transport: CoordinatorTransport, attempt: int, *, write_behind: bool = False
    ) -> RoundRecord:
        """One attempt at round ``self.version``: open, collect, and commit or abort.

        One step of :meth:`run_round`. A commit written behind by the previous attempt is
        settled once collection ends, before this attempt aggregates, aborts or writes anything
        (:meth:`_settle`).
        """
        machine = RoundMachine(self.version, attempt)
        self._notify(machine)
        current = Attempt(machine)
        self._collect(transport, current)
        new_hash = self._new_model(current)
        if new_hash is None:
            return self._abort(current, transport)
        return self._commit(current, new_hash, transport, write_behind=write_behind)

    def _new_model(self, current: Attempt) -> str | None:
        """Aggregate and step, or roll back; the new model's hash, None when the attempt aborts.

        The spool is emptied either way.
        """
        try:
            screening = None if current.masked else self._screen(current)
            if current.masked and self.central is not None:
                self.central.note_masked(current)
            if screening is None and current.masked_mean is None:
                return None  # below quorum, or the secure sums cannot commit
            if current.masked:
                self._advance(current.machine, RoundState.AGGREGATING)
            self.final.score(current, self.state)
            judgement = self.defences.judge(current, self.state)
            if judgement is not None and judgement.rollback:
                self._advance(current.machine, RoundState.COMMITTING)
                return self.defences.roll_back(judgement, self.state)
            shapes = {name: spec.shape for name, spec in self.architecture.items()}
            self._accumulator = self._accumulator or flat_empty(shapes)  # reused every round
            if current.masked_mean is not None:  # the secure sums' mean, no update seen alone
                combined = self._accumulator
                unflatten_into(current.masked_mean, combined)
            else:
                assert screening is not None
                clipped = self.central.clip(screening) if self.central is not None else {}
                combined = _combined(self._spool, screening, shapes, self.config, self._accumulator)
                lift_to_floor(combined, self.momentum, screening)
                if self.central is not None:
                    self.central.add_noise(current, combined, screening, clipped)
        finally:
            self._spool.reset()
        self._advance(current.machine, RoundState.COMMITTING)
        return outer_step(
            scheduled(self.outer, self.config, self.version, current.defences),
            self.params,
            self.momentum,
            combined,
            self.config.federation.robustness,
            version=self.version,
            parent=self.model_hash,
            defences=current.defences,
        )

    def _collect(self, transport: CoordinatorTransport, current: Attempt) -> None:
        """Open the attempt and judge submissions until every participant has one or time is up.

        The previous commit written behind is settled before the attempt closes.
        """
        fed = self.config.federation
        stragglers = Stragglers(fed, transport.now(), self.history)
        opening = RoundOpening(
            round_index=current.machine.round_index,
            attempt=(attempt := current.machine.attempt),
            model_version=self.version,
            model_hash=self.model_hash,
            deadline_s=stragglers.opened_at + fed.round_timeout_s,
            base_hash=round_base_hash(self.config, self.records, self.model_hash, attempt),
        )
        col = None if fed.aggregation == "masking" else self.admission.open(opening)
        transport.open_round(opening, self.model_payload())
        self._advance(current.machine, RoundState.COLLECTING)
        if col is None:  # masked: no single update is ever seen, only each group's sum
            self._settle()  # the previous round must be durable before this one changes anything
            return collect_masked(self, current, opening, transport)
        while not col.complete:
            submission = transport.receive(stragglers.wait_until(col))
            if submission is None:
                break
            transport.reply(submission, stragglers.judged(self.accept(submission), transport.now()))
            del submission  # its payload is spilled: let it go before the next one arrives
            if self.committer.failed():
                break  # the previous round is not durable: _settle raises why
        # The previous round must be durable before this one can change anything.
        self._settle()
        # A transport may know why a participant is absent: the ledger names that, not timeout.
        for pid, why in transport.absence_reasons().items():
            col.rejected.setdefault(pid, why)
        current.collect_s = stragglers.close(col, transport.now())
        current.collection = self.admission.close()
        current.traffic = transport.take_traffic()
        current.defences = {"aggregator": fed.robustness.aggregator}

    def _screen(self, current: Attempt) -> Screening | None:
        """Bound the updates' norms and score their senders; None when below quorum."""
        col, quorum = current.collection, self.config.federation.quorum
        if col is None or len(col.norms) < quorum:
            return None
        self._advance(current.machine, RoundState.AGGREGATING)
        robustness = self.config.federation.robustness
        defences = self.defences
        screening = current.screen(robustness, defences.suspicion.scores, defences.set_aside)
        self.defences.score(current)
        return screening if len(col.norms) >= quorum else None

    def _record(self, current: Attempt, new_hash: str) -> RoundRecord:
        """The attempt's ledger record; committed when ``new_hash`` is not the current model."""
        record = attempt_record(
            current,
            self._context,
            parent_hash=self.model_hash,
            new_hash=new_hash,
            commit_s=self.committer.commit_s,
        )
        if self.central is not None:
            self.central.closed(record)  # counted once its attempt has ended
        return record

    def _abort(self, current: Attempt, transport: CoordinatorTransport) -> RoundRecord:
        """End an attempt without changing global state (below quorum, or pre-commit failed)."""
        self._advance(current.machine, RoundState.ABORTED)
        record = self._record(current, self.model_hash)
        self.committer.close(record, transport, checkpoint=None)
        return record

    def _commit(
        self,
        current: Attempt,
        new_hash: str,
        transport: CoordinatorTransport,
        *,
        write_behind: bool,
    ) -> RoundRecord:
        """Make the stepped model the global one and write its checkpoint and ledger line."""
        self._payload_cache = None  # the committed model's payload replaces it
        record = self._record(current, new_hash)
        self.defences.keep(current)
        self.final.keep()
        state = self.state
        self.state = ModelState(
            state.version + 1, state.params, state.momentum, new_hash, state.model_hash
        )
        if write_behind:
            ckpt = self.store.checkpoint_of(self.state, record) if self.store.checkpoints else None
            self.committer.write_behind(record, ckpt, current.machine, transport)
            return record
        commit_start = time.perf_counter()
        checkpoint = self.store.save(self.state, record)
        self._advance(current.machine, RoundState.CLOSED)
        self.committer.close(record, transport, checkpoint=checkpoint)
        # The line cannot time its own checkpoint and append; the next line reports them.
        self.committer.commit_s = time.perf_counter() - commit_start
        return record

    def _settle(self, *, last: bool = False) -> None:
        """Wait until the commit written behind is durable; re-raise its error.

        Args:
            last: No other attempt opened since, so the observer hears that it CLOSED (a
                later round's state would be overwritten by a late CLOSED otherwise).

        Raises:
            DiskFull, OSError, IntegrityError: Whatever the checkpoint or the ledger append
                raised; the round is then not committed and a resume redoes it.
        """
        machine = self.committer.settle()
        if machine is not None and last:
            self._notify(machine)

    def _settle_after_failure(self) -> None:
        """Wait for the commit behind while another error ends the run; log, never mask it."""
        try:
            self._settle(last=True)
        except Exception as exc:  # the error already propagating is the one to report
            _log.error("the commit of the previous round failed as well: %s", exc)


def _combined(
    spool: UpdateSpool,
    screening: Screening,
    shapes: Mapping[str, tuple[int, ...]],
    config: LensembleConfig,
    out: Params,
) -> Params:
    """The screened updates of the spool combined into ``out`` (the round's accumulator)."""
    fed = config.federation
    return aggregate_spooled(
        spool,
        screening,
        shapes,
        fed.robustness,
        scheme=fed.quantization,
        chunk=fed.int8_chunk,
        out=out,
    )


def _wait_for_quorum(transport: CoordinatorTransport, config: LensembleConfig, of: int) -> None:
    """Wait for participants to join; refuse to start below quorum.

    Raises:
        QuorumNotReached: Fewer than ``quorum`` of the ``of`` participants joined in time.
    """
    fed = config.federation
    joined = transport.wait_for_participants(fed.quorum, fed.join_timeout_s)
    if len(joined) < fed.quorum:
        raise QuorumNotReached(
            f"only {len(joined)} of {of} participants joined within "
            f"federation.join_timeout_s ({fed.join_timeout_s} s); quorum is {fed.quorum}.",
            remediation="start more participants, check their logs, or lower federation.quorum.",
        )
