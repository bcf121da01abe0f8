"""The participant side of the network transport: join, watch, fetch, contribute, submit.

:class:`ParticipantLoop` drives an unchanged :class:`~lensemble.federation.participant.Participant`
over :class:`CoordinatorClient`:

1. **Join** with capped exponential backoff and jitter (participants may start before the
   coordinator), logging each retry once; a config-hash mismatch stops the process naming the
   differing fields. Joining tells the participant where the run is: it restores its inner state
   to match (:meth:`Participant.restore`) and contributes from the next round opening, so a
   restarted participant is never counted twice and never trains on a stale state.
2. **Watch** for a round opening newer than the last one handled.
3. **Fetch** the model (hash-verified by ``Participant.contribute``), **train**, and **submit**
   the sealed pseudo-gradient. A submission that failed in transit is resent byte for byte until
   the round's deadline; the coordinator counts it once. A round lost to a dead rank
   (:class:`~lensemble.errors.RankFailure`) is reported with **Abstain** (reason
   ``rank_failure``), so the coordinator records it as the in-process transport does and stops
   waiting for this participant.

Failures are classified by the gRPC status and the ``lensemble-reason`` trailing metadata, not by
message text: transient ones (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``) are retried with backoff;
``stale_session`` (the coordinator restarted) triggers a new Join; a lost round is skipped;
``PERMISSION_DENIED`` stops the process (exit 3).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import grpc

from lensemble import __version__
from lensemble.config import LensembleConfig, config_hash
from lensemble.config.hashing import canonical_json, hashed_view
from lensemble.errors import (
    ConfigError,
    ConfigProblem,
    IntegrityError,
    PayloadError,
    RankFailure,
    RankGroupExhausted,
)
from lensemble.federation.faults import FaultPlan
from lensemble.federation.messages import RANK_FAILURE, RoundOpening
from lensemble.federation.participant import Contribution, Participant
from lensemble.federation.payload import TensorSpec
from lensemble.network.participant.backoff import Backoff
from lensemble.network.participant.download_client import DownloadUnavailable, ModelDownloader
from lensemble.network.shared import transport_errors as nerr
from lensemble.network.shared.frames import (
    FETCH_METHOD,
    SUBMIT_METHOD,
    UPDATE_DATA_FIELD,
    parse_model_frame,
    passthrough,
)
from lensemble.network.shared.grpc_options import channel_options, presence_window_s
from lensemble.network.shared.identity import PARTICIPANT_KEY
from lensemble.network.shared.logs import event
from lensemble.network.shared.metrics import Metrics
from lensemble.network.shared.payload_limits import payload_limits
from lensemble.network.shared.peer_text import shown, shown_all
from lensemble.network.shared.proto import lensemble_pb2 as pb
from lensemble.network.shared.proto import lensemble_pb2_grpc as pb_grpc
from lensemble.network.shared.security import channel_credentials
from lensemble.network.shared.streams import Assembler, chunk_count, chunks, with_bytes_field
from lensemble.network.shared.transport_errors import (
    AccessDenied,
    CoordinatorUnreachable,
    ShutdownRequested,
)

_log = logging.getLogger("lensemble.network.participant")
#: Downloads that go over FetchModel at once after the download port could not be reached.
_DOWNLOAD_PAUSE = 16

#: Times a model that fails verification is fetched again within one round.
FETCH_ATTEMPTS = 3


class Failure(StrEnum):
    """What a failed call means for the participant."""

    TRANSIENT = "transient"
    STALE_SESSION = "stale_session"
    ROUND_LOST = "round_lost"
    REJECTED = "rejected"
    DENIED = "denied"


_TRANSIENT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.ABORTED,
    }
)


@dataclass(frozen=True)
class CallError:
    """A classified failed call.

    Attributes:
        kind: What it means for the participant.
        reason: The coordinator's reason (``lensemble-reason``), or the gRPC status name.
        message: The status details.
        current_round: The coordinator's round when it said so, else -1.
    """

    kind: Failure
    reason: str
    message: str
    current_round: int

    def __str__(self) -> str:
        # The coordinator's words: escaped and capped before they reach a log line.
        return f"{shown(self.reason)}: {shown(self.message)}"


def classify(exc: grpc.RpcError) -> CallError:
    """Turn a gRPC error into a :class:`CallError` using its status and trailing metadata."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = (exc.details() if hasattr(exc, "details") else "") or ""
    trailing = dict(exc.trailing_metadata() or ()) if hasattr(exc, "trailing_metadata") else {}
    reason = str(trailing.get(nerr.REASON_KEY, code.name.lower()))
    try:
        current = int(trailing.get(nerr.CURRENT_ROUND_KEY, -1))
    except ValueError:
        current = -1
    if reason == nerr.STALE_SESSION:
        kind = Failure.STALE_SESSION
    elif reason == nerr.TOO_MANY_CALLS:
        kind = Failure.TRANSIENT  # its own earlier calls still end on the coordinator
    elif code == grpc.StatusCode.PERMISSION_DENIED:
        kind = Failure.DENIED
    elif code == grpc.StatusCode.FAILED_PRECONDITION:
        kind = Failure.ROUND_LOST
    elif code in _TRANSIENT_CODES:
        kind = Failure.TRANSIENT
    else:
        kind = Failure.REJECTED
    return CallError(kind, reason, details, current)


def coordinator_target(config: LensembleConfig) -> str:
    """``host:port`` of the coordinator (IPv6 literals bracketed)."""
    host = config.network.host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{config.network.port}"


class CoordinatorClient:
    """Typed calls to the coordinator, each with a deadline.

    Args:
        config: The run's config.
        participant_id: This participant.
        token: Bearer token (``auth: token``), else None.
        metrics: Where to count bytes in and out.
        architecture: The global model's parameters (name -> spec): caps a model download at
            its wire size (:mod:`lensemble.network.shared.payload_limits`). None: the cap is
            ``network.max_message_bytes``, else the size the coordinator announces.

    Attributes:
        session: The coordinator session of the last accepted Join ("" before).

    Raises:
        ConfigError: ``network.max_message_bytes`` is below the model's wire size.
    """

    def __init__(
        self,
        config: LensembleConfig,
        participant_id: str,
        *,
        token: str | None = None,
        metrics: Metrics | None = None,
        architecture: Mapping[str, TensorSpec] | None = None,
    ) -> None:
        self.config = config
        self.id = participant_id
        self.metrics = metrics or Metrics()
        self.target = coordinator_target(config)
        credentials = channel_credentials(config, participant_id, token)
        options = channel_options(config)
        self.channel = (
            grpc.secure_channel(self.target, credentials, options=options)
            if credentials is not None
            else grpc.insecure_channel(self.target, options=options)
        )
        self.stub = pb_grpc.CoordinatorStub(self.channel)  # type: ignore[no-untyped-call]
        # SubmitUpdate sends frames built by streams.with_bytes_field (serializer: as is).
        self._submit_update = self.channel.stream_unary(
            SUBMIT_METHOD,
            request_serializer=passthrough,
            response_deserializer=pb.SubmitReply.FromString,
        )
        # FetchModel's chunks are read with the data field as a view (parse_model_frame).
        self._fetch_model = self.channel.unary_stream(
            FETCH_METHOD,
            request_serializer=pb.FetchModelRequest.SerializeToString,
            response_deserializer=parse_model_frame,
        )
        self.session = ""
        net = config.network
        self.timeout_s = net.rpc_timeout_s
        self.chunk_bytes = net.chunk_bytes
        self.max_bytes: int | None = (
            payload_limits(config, architecture).model_bytes
            if architecture is not None
            else net.max_message_bytes
        )
        # The download port (network.download_port), tried before FetchModel; after a failure
        # to reach it, the next _DOWNLOAD_PAUSE downloads go over FetchModel at once.
        self._downloader = (
            ModelDownloader(config, participant_id, token, self.metrics.bytes_in.inc)
            if net.download_port is not None
            else None
        )
        self._download_pause = 0
        self._download_warned = False
        # Every call names its participant, so the coordinator authenticates it before
        # reading any request (see lensemble.network.coordinator.call_guard).
        self.metadata = ((PARTICIPANT_KEY, participant_id),)
        self._presence_call: Any = None
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the channel (ending a held presence stream) and the download connection."""
        self.end_presence()
        if self._downloader is not None:
            self._downloader.close()
        self.channel.close()

    def join(self) -> pb.JoinReply:
        """Join the run (the session is kept when accepted)."""
        reply: pb.JoinReply = self.stub.Join(
            pb.JoinRequest(
                participant_id=self.id,
                config_hash=config_hash(self.config),
                config_view_json=canonical_json(hashed_view(self.config)).decode(),
                software_version=__version__,
            ),
            timeout=self.timeout_s,
            metadata=self.metadata,
        )
        if reply.accepted:
            self.session = reply.session
        return reply

    def watch(self, after: tuple[int, int]) -> pb.RoundAnnouncement | None:
        """The next opening newer than ``after``, or None when the watch window ended."""
        call = self.stub.WatchRounds(
            pb.WatchRoundsRequest(
                participant_id=self.id,
                session=self.session,
                after_round=after[0],
                after_attempt=after[1],
            ),
            timeout=self.timeout_s,
            metadata=self.metadata,
        )
        try:
            for announcement in call:
                return announcement  # type: ignore[no-any-return]
        finally:
            call.cancel()
        return None

    def fetch(self, announcement: pb.RoundAnnouncement) -> bytes:
        """Download the round's model payload.

        Over the download port when the config has one and it serves
        (:mod:`lensemble.network.participant.download_client`), else over gRPC FetchModel.

        Raises:
            PayloadError: The coordinator announced a model above ``max_message_bytes``, sent
                more or fewer bytes than it declared, or sent a malformed chunk.
            grpc.RpcError: The call failed.
        """
        limit = announcement.model_bytes if self.max_bytes is None else self.max_bytes
        downloaded = self._download(announcement, limit)
        if downloaded is not None:
            return downloaded
        deadline = self.timeout_s * chunk_count(announcement.model_bytes, self.chunk_bytes)
        call = self._fetch_model(
            pb.FetchModelRequest(
                participant_id=self.id, session=self.session, model_hash=announcement.model_hash
            ),
            timeout=deadline,
            metadata=self.metadata,
        )
        what = f"the model of round {announcement.round_index}"
        assembler: Assembler | None = None
        try:
            for frame in call:
                if frame.error is not None:
                    raise PayloadError(
                        f"{what} arrived in a malformed chunk: {frame.error}",
                        remediation="the coordinator is broken or hostile; the download was "
                        "refused.",
                    )
                if assembler is None:
                    # Not hashed: the decoded model is checked against its model hash.
                    assembler = Assembler(frame.total_bytes, limit, what, hashed=False)
                assembler.add(frame.data)  # a view of the received frame: its only copy
                self.metrics.bytes_in.inc(len(frame.data))
        finally:
            call.cancel()
        if assembler is None:
            raise PayloadError("the coordinator sent no model bytes.")
        payload = assembler.finish()
        assert isinstance(payload, bytes)  # assembled in memory: only updates land on disk
        return payload

    def _download(self, announcement: pb.RoundAnnouncement, limit: int) -> bytes | None:
        """The model over the download port, or None to fetch it over gRPC.

        Raises:
            PayloadError: The coordinator broke the download's protocol.
        """
        if self._downloader is None:
            return None
        if self._download_pause > 0:
            self._download_pause -= 1
            return None
        try:
            return self._downloader.fetch(
                self.session, announcement.model_hash, announcement.model_bytes, limit
            )
        except DownloadUnavailable as exc:
            if not exc.reachable:
                self._download_pause = _DOWNLOAD_PAUSE
            # Once at warning level: a closed port would otherwise log every few rounds.
            level = logging.DEBUG if self._download_warned else logging.WARNING
            self._download_warned = True
            _log.log(
                level,
                "the model download port %s:%s did not serve the model of round %d (%s); "
                "fetching it over gRPC FetchModel, which is slower. Open "
                "network.download_port between participant and coordinator, or set it to null.",
                self._downloader.host,
                self._downloader.port,
                announcement.round_index,
                exc,
            )
            return None

    def submit(
        self,
        opening: RoundOpening,
        contribution: Contribution,
        before_last: Callable[[], None] | None = None,
    ) -> pb.SubmitReply:
        """Stream a sealed pseudo-gradient and return the coordinator's verdict.

        Args:
            opening: The round the update is for.
            contribution: The sealed update.
            before_last: Called before the last chunk is sent (the participant's inner-state
                snapshot is settled there, so it is durable before the update can count).

        Raises:
            grpc.RpcError: The call failed.
            Exception: Whatever ``before_last`` raised; the stream then ended short, so the
                coordinator refused the update.
        """
        payload = contribution.payload
        header = pb.UpdateHeader(
            participant_id=self.id,
            session=self.session,
            round_index=opening.round_index,
            attempt=opening.attempt,
            payload_hash=contribution.payload_hash,
            quantization=self.config.federation.quantization,
            total_bytes=len(payload),
            compute_s=contribution.compute_s,
        )

        failed: list[Exception] = []
        count = chunk_count(len(payload), self.chunk_bytes)

        def stream() -> Iterator[bytes]:
            # Serialized UpdateChunk frames: the header, then one copy of each chunk.
            prefix = pb.UpdateChunk(header=header).SerializeToString()
            for index, view in enumerate(chunks(payload, self.chunk_bytes)):
                if index == count - 1 and before_last is not None:
                    try:
                        before_last()
                    except Exception as exc:  # raised below, once the call has ended
                        failed.append(exc)
                        return
                self.metrics.bytes_out.inc(len(view))
                yield with_bytes_field(prefix, UPDATE_DATA_FIELD, view)
                prefix = b""

        deadline = self.timeout_s * (count + 1)
        try:
            reply: pb.SubmitReply = self._submit_update(
                stream(), timeout=deadline, metadata=self.metadata
            )
        except grpc.RpcError:
            if failed:
                raise failed[0] from None
            raise
        if failed:
            raise failed[0]
        return reply

    def abstain(self, opening: RoundOpening, reason: str) -> pb.AbstainReply:
        """Tell the coordinator this participant sits out ``opening``'s attempt, for ``reason``.

        Args:
            opening: The attempt sat out.
            reason: One of ``lensemble.federation.messages.ABSTENTION_REASONS``.

        Raises:
            grpc.RpcError: The call failed (``UNIMPLEMENTED`` from a coordinator that predates
                ``Abstain``).
        """
        reply: pb.AbstainReply = self.stub.Abstain(
            pb.AbstainRequest(
                participant_id=self.id,
                session=self.session,
                round_index=opening.round_index,
                attempt=opening.attempt,
                reason=reason,
            ),
            timeout=self.timeout_s,
            metadata=self.metadata,
        )
        return reply

    def leave(self, reason: str) -> None:
        """Tell the coordinator this participant stops (best effort, one short call)."""
        try:
            self.stub.Leave(
                pb.LeaveRequest(participant_id=self.id, session=self.session, reason=reason),
                timeout=min(self.timeout_s, 5.0),
                metadata=self.metadata,
            )
        except grpc.RpcError as exc:
            _log.info("could not say goodbye to the coordinator (%s).", classify(exc))

    def hold_presence(self, stop: threading.Event) -> None:
        """Keep a Presence stream open until ``stop`` is set (run it in its own thread).

        Each stream lasts one window; the next opens at once. A failed stream is retried
        after a short pause (the main loop handles rejoining and giving up). The first beat
        of a stream after a failed one logs ``present``: the coordinator counts this
        participant present again from that beat on (its handler counts before the beat).
        """
        window = presence_window_s(self.config)
        failed = False
        while not stop.is_set():
            call = self.stub.Presence(
                pb.PresenceRequest(participant_id=self.id, session=self.session),
                timeout=window + 2 * self.timeout_s,
                metadata=self.metadata,
            )
            with self._lock:
                self._presence_call = call
            if stop.is_set():
                call.cancel()
                return
            try:
                for _beat in call:
                    if failed:
                        failed = False
                        event(_log, "present", "the coordinator counts this participant again.")
                    if stop.is_set():
                        break
            except grpc.RpcError as exc:
                error = classify(exc)
                if error.reason != "cancelled":
                    failed = True
                    _log.debug("presence stream ended (%s); opening another.", error)
                stop.wait(min(1.0, self.timeout_s))
            finally:
                call.cancel()

    def end_presence(self) -> None:
        """Cancel the presence stream held by :meth:`hold_presence` (if any)."""
        with self._lock:
            call, self._presence_call = self._presence_call, None
        if call is not None:
            call.cancel()


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
        self.after: tuple[int, int] = (-1, -1)
        self.rounds_contributed: list[tuple[int, int]] = []
        self._failing_since: float | None = None

    # ---------------------------------------------------------------------------- helpers
    def _ready(self, ready: bool) -> None:
        self.metrics.joined.set(1 if ready else 0)
        self._on_ready(ready)

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise ShutdownRequested(f"participant {self.client.id} is shutting down;")

    def _succeeded(self) -> None:
        if self._failing_since is not None:
            down_s = time.monotonic() - self._failing_since
            event(_log, "reconnected", f"reached the coordinator after {down_s:.1f} s of retries.")
            self._ready(True)
        self._failing_since = None
        self.backoff.reset()

    def _failed(self, what: str, error: CallError) -> None:
        """Wait before retrying a transient failure; give up after ``join_timeout_s``.

        Raises:
            CertificateRejected: The failure is a TLS certificate problem: no retry can fix it.
            CoordinatorUnreachable: Still failing after ``federation.join_timeout_s``.
        """
        cause = nerr.certificate_failure(error.message)
        if cause is not None:
            raise nerr.CertificateRejected(
                f"the TLS handshake with the coordinator at {self.client.target} failed: "
                f"{cause} ({shown(error.message)});",
                remediation="renew or replace the certificate (`lensemble certs init` renews a "
                "development set; docs/troubleshooting.md).",
            )
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
            self._ready(False)
        limit = self.config.federation.join_timeout_s
        if now - self._failing_since > limit:
            raise CoordinatorUnreachable(
                f"the coordinator at {self.client.target} has not answered for "
                f"{now - self._failing_since:.0f} s (federation.join_timeout_s is {limit} s; "
                f"last error {error});",
                remediation="check that the coordinator runs and that network.host and "
                "network.port point at it.",
            )
        delay = self.backoff.next_delay()
        event(
            _log,
            "retry",
            f"{what} failed (attempt {self.backoff.attempt}, {error}); retrying in {delay:.1f} s.",
            logging.WARNING,
            attempt=self.backoff.attempt,
            delay_s=round(delay, 3),
            reason=error.reason,
        )
        self.stop.wait(delay)
        self._check_stop()

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
                    raise AccessDenied(
                        f"the coordinator refused participant '{self.client.id}': "
                        f"{shown(error.message)}",
                        remediation="use this participant's own certificate or token.",
                    ) from None
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
        self._line_up(reply)
        self._ready(True)

    def _line_up(self, reply: pb.JoinReply) -> None:
        """Restore the inner state for the next round this participant will train.

        With a round open the participant skips it (contributes from the next opening): if it
        already has an accepted update there, its state is the one after that training; if not,
        the one before it, as if it had been absent. With no round open it trains the next one.
        """
        current = reply.collecting_round
        if reply.round_open:
            self.after = (current, reply.collecting_attempt)
            restore_round = current + 1 if reply.already_submitted else current
        else:
            self.after = (current - 1, 1 << 30)
            restore_round = current
        restored = self.participant.restore(restore_round)
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
            raise AccessDenied(
                f"the coordinator refused participant '{self.client.id}': {shown(error.message)}",
                remediation="use this participant's own certificate or token.",
            )
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
        )
        self.after = (opening.round_index, opening.attempt)
        self.metrics.round_index.set(opening.round_index)
        self.metrics.round_attempt.set(opening.attempt)
        contribution = self._train(announcement, opening)
        if contribution is not None:
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
            try:
                # The snapshot is written while the update streams; see _submit.
                contribution = self.participant.contribute(opening, payload, snapshot_behind=True)
            except IntegrityError as exc:
                _log.warning("model of %s failed verification (try %d): %s", where, attempt, exc)
                continue
            except PayloadError as exc:
                _log.error("skipping %s: %s", where, exc)
                return None
            except RankFailure as exc:  # a rank died: the round is lost, the group restarts
                _log.error("skipping %s: %s", where, exc)
                self._abstain(opening, RANK_FAILURE)
                return None
            self.metrics.contributed(
                compute_s=contribution.compute_s,
                serialize_s=contribution.serialize_s,
                deserialize_s=contribution.deserialize_s,
                inner_steps=self.config.federation.inner_steps,
                mean_loss=contribution.mean_loss,
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
        if self.participant.forget(opening.round_index, opening.attempt):
            event(
                _log,
                "rewound",
                f"inner state back to before round {opening.round_index} attempt "
                f"{opening.attempt}, whose update was not taken.",
                round=opening.round_index,
                attempt=opening.attempt,
            )


def config_view(config: LensembleConfig) -> dict[str, Any]:
    """The hashed part of a config, as sent in Join (for tests and diagnostics)."""
    return json.loads(canonical_json(hashed_view(config)))  # type: ignore[no-any-return]
