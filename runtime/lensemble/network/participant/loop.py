"""A participant's rounds: join, watch, fetch, contribute, submit.

:class:`ParticipantLoop` drives an unchanged :class:`~lensemble.federation.participant.Participant`
over :class:`~lensemble.network.participant.client.CoordinatorClient`:

1. **Join** with capped exponential backoff and jitter (participants may start before the
   coordinator), logging each retry once; a config-hash mismatch stops the process naming the
   differing fields. Joining tells the participant where the run is: it restores its inner state
   to match (:meth:`Participant.restore`) and contributes from the next round opening, so a
   restarted participant is never counted twice and never trains on a stale state.
2. **Watch** for a round opening newer than the last one handled.
3. **Fetch** the model (hash-verified by ``Participant.contribute``), **train**, and **submit**
   the sealed pseudo-gradient (under ``federation.aggregation: masking``, answer the attempt's
   secure-aggregation stages instead: :mod:`lensemble.network.participant.masked_round`). A
   submission that failed in transit is resent byte for byte until
   the round's deadline; the coordinator counts it once. A round lost to a dead rank
   (:class:`~lensemble.errors.RankFailure`) is reported with **Abstain** (reason
   ``rank_failure``), so the coordinator records it as the in-process transport does and stops
   waiting for this participant; so is every round that training would spend past the
   participant's own differential-privacy budget (reason ``privacy_budget``).

What a failed call means is :mod:`lensemble.network.participant.call_errors`'s; when to retry
it, :mod:`lensemble.network.participant.retries`'s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from lensemble.config import LensembleConfig
from lensemble.errors import (
    ConfigError,
    ConfigProblem,
    IntegrityError,
    OverlapBaseMissing,
    PayloadError,
    PrivacyBudgetExhausted,
    RankFailure,
    RankGroupExhausted,
)
from lensemble.federation.faults import FaultPlan
from lensemble.federation.messages import (
    PRIVACY_BUDGET,
    RoundOpening,
)
from lensemble.federation.participant import Contribution, Participant
from lensemble.network.participant.ahead import TrainAhead
from lensemble.network.participant.backoff import Backoff
from lensemble.network.participant.call_errors import CallError, Failure, classify
from lensemble.network.participant.client import CoordinatorClient
from lensemble.network.participant.masked_round import MaskedRounds
from lensemble.network.participant.retries import Retries
from lensemble.network.shared.logs import event
from lensemble.network.shared.peer_text import shown, shown_all
from lensemble.network.shared.proto import lensemble_pb2 as pb
from lensemble.network.shared.transport_errors import AccessDenied, ShutdownRequested

_log = logging.getLogger("lensemble.network.participant")

#: Times a model that fails verification is fetched again within one round.
FETCH_ATTEMPTS = 3

#: Longest hash an announcement may name as a round's base (``sha256:`` and 64 hex digits, with
#: room to spare); a longer one is cut, so it names no model this participant holds.
BASE_HASH_CHARS = 80


def line_up(participant: Participant, reply: pb.JoinReply) -> tuple[int, int]:
    """Restore the inner state for the next round the participant will train after joining.

    With a round open the participant skips it (contributes from the next opening): if it
    already has an accepted update there, its state is the one after that training; if not,
    the one before it, as if it had been absent. With no round open it trains the next one.

    Returns:
        The last ``(round, attempt)`` to consider handled: the loop watches for newer ones.
    """
    current = reply.collecting_round
    if reply.round_open:
        after = (current, reply.collecting_attempt)
        restore_round = current + 1 if reply.already_submitted else current
    else:
        after = (current - 1, 1 << 30)
        restore_round = current
    restored = participant.restore(restore_round)
    event(
        _log,
        "joined",
        f"joined the coordinator at round {current}"
        f"{' (open, contributing from the next one)' if reply.round_open else ''}; inner "
        f"state {'restored' if restored else 'fresh'} for round {restore_round}.",
        round=current,
        round_open=reply.round_open,
        restored=restored,
    )
    return after


class ParticipantLoop:
    """Runs one participant against the coordinator until the run is over.

    Args:
        config: The run's config.
        participant: The federation participant (learner, residency guard, inner state).
        client: Calls to the coordinator.
        stop: Set from another thread to stop (SIGTERM); the loop then raises
            ``ShutdownRequested`` at its next step.
        on_ready: Called with True once joined, False while the coordinator is unreachable.
        backoff: Reconnection delays (from ``network.connect_backoff_max_s`` by default).
        faults: Faults this participant applies to itself (``rank_kill`` entries naming it,
            as the in-process transport applies them): its learner's ``arm_rank_kill`` is
            called before it trains the targeted attempt.
    """

    def __init__(
        self,
        config: LensembleConfig,
        participant: Participant,
        client: CoordinatorClient,
        *,
        stop: threading.Event | None = None,
        on_ready: Callable[[bool], None] | None = None,
        backoff: Backoff | None = None,
        faults: FaultPlan | None = None,
    ) -> None:
        self.config = config
        self.participant = participant
        self.faults = faults or FaultPlan()
        self.client = client
        self.metrics = client.metrics
        self.stop = stop or threading.Event()
        self._on_ready = on_ready or (lambda ready: None)
        self.backoff = backoff or Backoff(config.network.connect_backoff_max_s)
        self.retries = Retries(
            target=client.target,
            join_timeout_s=config.federation.join_timeout_s,
            backoff=self.backoff,
            stop=self.stop,
            on_ready=self._ready,
        )
        # Masked rounds: the update stays here, only the secure-aggregation answers leave.
        self._out_of_budget = False  # said once in the log, then it abstains every round
        self.masked = (
            MaskedRounds(
                config, client, participant.architecture, self.stop, participant.masking_record
            )
            if config.federation.aggregation == "masking"
            else None
        )
        self.after: tuple[int, int] = (-1, -1)
        self.rounds_contributed: list[tuple[int, int]] = []
        # federation.overlap one_round: the next round trains while this one's update travels.
        kills = any(
            f.kind == "rank_kill" and f.participant == client.id for f in self.faults.faults
        )
        self.ahead = TrainAhead(participant, enabled=not kills)

    # ---------------------------------------------------------------------------- helpers
    def _ready(self, ready: bool) -> None:
        self.metrics.joined.set(1 if ready else 0)
        self._on_ready(ready)

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise ShutdownRequested(f"participant {self.client.id} is shutting down;")

    def _succeeded(self) -> None:
        self.retries.succeeded()

    def _failed(self, what: str, error: CallError) -> None:
        """Wait before retrying a transient failure (see :meth:`Retries.failed`).

        Raises:
            ShutdownRequested: ``stop`` was set meanwhile.
            CertificateRejected: The failure is a TLS certificate problem: no retry can fix it.
            CoordinatorUnreachable: Still failing after ``federation.join_timeout_s``.
        """
        self.retries.failed(what, error)
        self._check_stop()

    def _denied(self, error: CallError) -> AccessDenied:
        """The error that stops this participant when the coordinator refused its credentials."""
        return AccessDenied(
            f"the coordinator refused participant '{self.client.id}': {shown(error.message)}",
            remediation="use this participant's own certificate or token.",
        )

    # ------------------------------------------------------------------------------- join
    def join(self) -> None:
        """Join (with backoff) and line the inner state up with the coordinator's round.

        Raises:
            ConfigError: The coordinator refused the config, naming the differing fields.
            AccessDenied: The coordinator refused this participant's credentials.
            CoordinatorUnreachable: No answer within ``federation.join_timeout_s``.
            CertificateRejected: The TLS handshake failed on a certificate (not retried).
        """
        while True:
            self._check_stop()
            try:
                reply = self.client.join()
                break
            except grpc.RpcError as exc:
                error = classify(exc)
                if error.kind == Failure.DENIED:
                    raise self._denied(error) from None
                self._failed("joining the coordinator", error)
        if not reply.accepted:
            problems = [
                ConfigProblem(path, "differs from the coordinator's config; use the same value.")
                for path in shown_all(reply.differing_fields)
            ]
            raise ConfigError(
                problems or shown(reply.message),
                remediation=f"the coordinator's config hash is {shown(reply.config_hash)}; run "
                "every process with the same config (`lensemble config diff A B`).",
            )
        self._succeeded()
        self.ahead.settle()
        self.after = line_up(self.participant, reply)
        self._ready(True)

    # ------------------------------------------------------------------------------- loop
    def run(self) -> None:
        """Take part in rounds until the coordinator announces the end of the run.

        Raises:
            ShutdownRequested: ``stop`` was set.
            ConfigError: Join refused (config mismatch).
            AccessDenied: Credentials refused.
            CoordinatorUnreachable: The coordinator stayed away beyond ``join_timeout_s``.
            CertificateRejected: The TLS handshake failed on a certificate (not retried).
            ResidencyViolation: The learner tried to release something other than a
                pseudo-gradient (fails closed).
            RankGroupExhausted: The rank group lost more rounds than its ``max_restarts``
                (the participant has said ``Leave`` first).
        """
        self.join()
        done = threading.Event()
        presence = threading.Thread(
            target=self.client.hold_presence,
            args=(done,),
            name=f"{self.client.id}-presence",
            daemon=True,
        )
        presence.start()
        try:
            self._rounds()
        except RankGroupExhausted:
            # Say goodbye before exiting, so the coordinator records "left" at once (as the
            # in-process transport does) instead of a broken connection.
            self.client.leave(RankGroupExhausted.code)
            raise
        finally:
            # A process must not exit while a thread is inside torch (it aborts): a shutdown
            # waits for the next round's training in flight (none after the last round).
            self.ahead.settle()
            done.set()
            self.client.end_presence()
            presence.join(self.client.timeout_s)

    def _rounds(self) -> None:
        while True:
            self._check_stop()
            try:
                announcement = self.client.watch(self.after)
            except grpc.RpcError as exc:
                self._on_error("watching for rounds", classify(exc))
                continue
            self._succeeded()
            if announcement is None:
                continue
            if announcement.final:
                event(_log, "run_over", "the run is over; leaving.")
                self.client.leave("run over")
                return
            self._take_part(announcement)

    def _on_error(self, what: str, error: CallError) -> None:
        if error.kind == Failure.STALE_SESSION:
            event(_log, "rejoin", "the coordinator restarted; joining again.")
            self.join()
        elif error.kind == Failure.DENIED:
            raise self._denied(error)
        elif error.kind == Failure.TRANSIENT:
            self._failed(what, error)
        else:
            _log.warning("%s failed (%s); watching for the next round.", what, error)

    def _take_part(self, announcement: pb.RoundAnnouncement) -> None:
        opening = RoundOpening(
            round_index=announcement.round_index,
            attempt=announcement.attempt,
            model_version=announcement.model_version,
            model_hash=announcement.model_hash,
            deadline_s=time.monotonic() + announcement.deadline_in_s,
            base_hash=announcement.base_hash[:BASE_HASH_CHARS],
        )
        self.after = (opening.round_index, opening.attempt)
        self.metrics.round_index.set(opening.round_index)
        self.metrics.round_attempt.set(opening.attempt)
        contribution = self._train(announcement, opening)
        if contribution is not None and self.masked is not None:
            self.participant.settle_snapshot()  # durable before anything of it can count
            if self.masked.take_part(opening, contribution, self._on_error):
                self.rounds_contributed.append((opening.round_index, opening.attempt))
        elif contribution is not None:
            self.ahead.start(opening)
            self._submit(opening, contribution)
            self.participant.settle_snapshot()  # when the update never reached its last chunk

    def _train(
        self, announcement: pb.RoundAnnouncement, opening: RoundOpening
    ) -> Contribution | None:
        where = f"round {opening.round_index} attempt {opening.attempt}"
        here = (opening.round_index, opening.attempt)
        attempt = 0
        while attempt < FETCH_ATTEMPTS:
            attempt += 1
            self._check_stop()
            try:
                payload = self.client.fetch(announcement)
            except grpc.RpcError as exc:
                error = classify(exc)
                if error.kind == Failure.TRANSIENT and time.monotonic() < opening.deadline_s:
                    self._failed(f"fetching the model of {where}", error)
                    attempt -= 1  # the model was not checked: not a verification failure
                    continue
                self._on_error(f"fetching the model of {where}", error)
                return None
            except PayloadError as exc:
                _log.error("the model of %s is unusable: %s", where, exc)
                return None
            self._check_stop()
            # The rank_kill fault, armed right before training as InProcessTransport arms it
            # (run_participant checked that the learner has ranks to kill).
            kill = self.faults.hits("rank_kill", self.client.id, *here)
            if kill is not None:
                learner: Any = self.participant.learner
                learner.arm_rank_kill(int(kill.value or 1))
            # The next round trained ahead (federation.overlap) while the model came down.
            self.ahead.settle()
            try:
                # The snapshot is written while the update streams; see _submit.
                contribution = self.participant.contribute(opening, payload, snapshot_behind=True)
            except IntegrityError as exc:
                _log.warning("model of %s failed verification (try %d): %s", where, attempt, exc)
                continue
            except PayloadError as exc:
                _log.error("skipping %s: %s", where, exc)
                return None
            except (RankFailure, OverlapBaseMissing) as exc:
                # A rank died (the group restarts), or it lacks the overlapped round's base:
                # this round is lost, the next one is trained. The error's code is the reason.
                _log.error("skipping %s: %s", where, exc)
                self._abstain(opening, exc.code)
                return None
            except PrivacyBudgetExhausted as exc:  # its own budget: it sits out from now on
                if not self._out_of_budget:
                    _log.warning("%s", exc)
                    self._out_of_budget = True
                self._abstain(opening, PRIVACY_BUDGET)
                return None
            self.metrics.contributed(
                compute_s=contribution.compute_s,
                serialize_s=contribution.serialize_s,
                deserialize_s=contribution.deserialize_s,
                inner_steps=self.config.federation.inner_steps,
                mean_loss=contribution.mean_loss,
                privacy_epsilon=contribution.privacy_epsilon,
            )
            event(
                _log,
                "trained",
                f"trained {where} in {contribution.compute_s:.2f} s (mean inner loss "
                f"{contribution.mean_loss:.4f}); update is {len(contribution.payload)} bytes.",
                round=opening.round_index,
                attempt=opening.attempt,
                compute_s=contribution.compute_s,
                payload_bytes=len(contribution.payload),
            )
            return contribution
        _log.error("skipping %s: the model failed verification %d times.", where, FETCH_ATTEMPTS)
        return None

    def _submit(self, opening: RoundOpening, contribution: Contribution) -> None:
        where = f"round {opening.round_index} attempt {opening.attempt}"
        while True:
            self._check_stop()
            try:
                reply = self.client.submit(
                    opening, contribution, before_last=self.participant.settle_snapshot
                )
            except grpc.RpcError as exc:
                error = classify(exc)
                self.metrics.verdict(False, error.reason)
                if error.kind == Failure.TRANSIENT and time.monotonic() < opening.deadline_s:
                    # Resending identical bytes is safe: the coordinator counts them once.
                    self._failed(f"submitting the update of {where}", error)
                    continue
                if error.kind == Failure.TRANSIENT:
                    _log.warning("the update of %s is lost: %s (deadline passed).", where, error)
                elif error.kind == Failure.ROUND_LOST:
                    event(
                        _log,
                        "round_lost",
                        f"the update of {where} came too late: {shown(error.message)}",
                        round=opening.round_index,
                        reason=error.reason,
                    )
                elif error.kind == Failure.REJECTED:
                    event(
                        _log,
                        "rejected",
                        f"the coordinator rejected the update of {where}: {error}",
                        logging.ERROR,
                        round=opening.round_index,
                        reason=error.reason,
                    )
                else:
                    self._on_error(f"submitting the update of {where}", error)
                    return
                self._forget(opening)
                return
            self._succeeded()
            self.metrics.verdict(reply.accepted, reply.reason)
            if not reply.accepted:
                self._forget(opening)
            self.rounds_contributed.append((opening.round_index, opening.attempt))
            note = "" if reply.reason == "accepted" else f" ({shown(reply.message)})"
            event(
                _log,
                "submitted",
                f"update of {where}: {shown(reply.reason)}{note}",
                round=opening.round_index,
                attempt=opening.attempt,
                reason=reply.reason,
            )
            return

    def _abstain(self, opening: RoundOpening, reason: str) -> None:
        """Tell the coordinator this participant sits out ``opening``'s attempt (best effort).

        Retried with backoff while the failure is transient and the attempt's deadline has not
        passed. Without it (a coordinator that predates ``Abstain``, a closed round) the
        coordinator records ``timeout`` instead of ``reason``; nothing else changes.
        """
        where = f"round {opening.round_index} attempt {opening.attempt}"
        while True:
            self._check_stop()
            try:
                reply = self.client.abstain(opening, reason)
            except grpc.RpcError as exc:
                error = classify(exc)
                if error.kind == Failure.TRANSIENT and time.monotonic() < opening.deadline_s:
                    self._failed(f"telling the coordinator it sits out {where}", error)
                    continue
                if error.kind in (Failure.STALE_SESSION, Failure.DENIED):
                    self._on_error(f"telling the coordinator it sits out {where}", error)
                    return
                _log.warning(
                    "could not tell the coordinator that this participant sits out %s (%s); "
                    "it will record a timeout.",
                    where,
                    error,
                )
                return
            self._succeeded()
            event(
                _log,
                "abstained",
                f"sat out {where} ({reason}): {shown(reply.outcome)}.",
                round=opening.round_index,
                attempt=opening.attempt,
                reason=reason,
            )
            return

    def _forget(self, opening: RoundOpening) -> None:
        """The update was not taken: train on as if absent from that round (see forget)."""
        self.ahead.settle()  # trained from the state being rewound: contribute discards it
        if self.participant.forget(opening.round_index, opening.attempt):
            event(
                _log,
                "rewound",
                f"inner state back to before round {opening.round_index} attempt "
                f"{opening.attempt}, whose update was not taken.",
                round=opening.round_index,
                attempt=opening.attempt,
            )
