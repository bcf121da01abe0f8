"""The gRPC servicer of ``lensemble.v1.Coordinator``: the handlers of its seven RPCs.

The call guard authenticated the caller before a handler runs
(:mod:`lensemble.network.coordinator.call_guard`); handlers check that the request names the
same participant, check the coordinator session, and translate between protobuf messages and
the transport. A refusal ends the call with a gRPC status plus the trailing metadata
``lensemble-reason`` and ``lensemble-current-round``, so the participant can tell the causes
apart without parsing text.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, NoReturn

import grpc

from lensemble import __version__
from lensemble.errors import PayloadError
from lensemble.federation.intake import Landing
from lensemble.federation.messages import Reason, Submission, Verdict
from lensemble.network.coordinator.authenticator import Authenticator
from lensemble.network.coordinator.call_guard import claimed_participant, extend_deadline
from lensemble.network.coordinator.masking_service import remember_certificate
from lensemble.network.coordinator.rejection import Rejection
from lensemble.network.coordinator.transport import GrpcCoordinatorTransport
from lensemble.network.shared import transport_errors as nerr
from lensemble.network.shared.frames import MODEL_DATA_FIELD, UpdateFrame
from lensemble.network.shared.grpc_options import presence_window_s
from lensemble.network.shared.peer_text import ABSTAIN_LIMITS, JOIN_LIMITS, oversized_field
from lensemble.network.shared.proto import lensemble_pb2 as pb
from lensemble.network.shared.proto import lensemble_pb2_grpc as pb_grpc
from lensemble.network.shared.streams import (
    Assembler,
    TooLarge,
    chunk_count,
    chunks,
    with_bytes_field,
)


class _Aborted(Exception):
    """Raised by ``context.abort``; never escapes a handler."""


class CoordinatorService(pb_grpc.CoordinatorServicer):
    """Handlers of the coordinator's RPCs.

    Args:
        transport: The coordinator transport the handlers feed.
        authenticator: Decides who a caller is.
        update_limit: Largest update payload accepted (bytes; see
            :mod:`lensemble.network.shared.payload_limits`).

    Update streams land where the transport's :class:`~lensemble.federation.intake.Intake`
    says (the coordinator's spool files), never through the coordinator itself.
    """

    def __init__(
        self,
        transport: GrpcCoordinatorTransport,
        authenticator: Authenticator,
        update_limit: int,
    ) -> None:
        self.transport = transport
        self.auth = authenticator
        net = transport.config.network
        self.max_bytes = update_limit
        self.presence_window_s = presence_window_s(transport.config)
        self.chunk_bytes = net.chunk_bytes
        self.rpc_timeout_s = net.rpc_timeout_s
        # A watch stream ends on its own well within the caller's deadline; the caller
        # watches again, so no call ever waits unbounded.
        self.watch_window_s = net.rpc_timeout_s / 2

    # ------------------------------------------------------------------------------ helpers
    def refuse(
        self, context: Any, reason: str, message: str, status: grpc.StatusCode, rpc: str
    ) -> NoReturn:
        """End a call refused by the call guard (counted like every refusal)."""
        self.transport.metrics.refused_calls.labels(rpc=rpc, reason=reason).inc()
        context.set_trailing_metadata(
            (
                (nerr.REASON_KEY, reason),
                (nerr.CURRENT_ROUND_KEY, str(self.transport.collecting_round)),
            )
        )
        context.abort(status, message)
        raise _Aborted

    def _abort(
        self, context: Any, rejection: Rejection, *, rpc: str, count: bool = True
    ) -> NoReturn:
        # count=False: a verdict of the coordinator, which its observer already counted.
        metrics = self.transport.metrics
        if count and rpc == "SubmitUpdate":
            metrics.verdict(False, rejection.reason)
        elif count:
            metrics.refused_calls.labels(rpc=rpc, reason=rejection.reason).inc()
        context.set_trailing_metadata(
            (
                (nerr.REASON_KEY, rejection.reason),
                (nerr.CURRENT_ROUND_KEY, str(rejection.current_round)),
            )
        )
        context.abort(rejection.status, rejection.message)
        raise _Aborted  # context.abort always raises; this keeps type checkers honest

    def _authorize(self, context: Any, claimed: str, rpc: str) -> None:
        # The call guard authenticated the id the call claims in its metadata; the request
        # must name the same participant.
        caller = claimed_participant(context)
        if claimed != caller:
            unknown = claimed not in self.auth.participants
            rejection = Rejection(
                Reason.UNKNOWN_PARTICIPANT.value if unknown else nerr.BAD_CREDENTIALS,
                f"the call is authenticated as participant {caller!r} but its request names "
                f"{claimed[:64]!r}.",
                self.transport.collecting_round,
            )
            self._abort(context, rejection, rpc=rpc)

    def _check_session(self, context: Any, session: str, rpc: str) -> None:
        rejection = self.transport.stale_session(session)
        if rejection is not None:
            self._abort(context, rejection, rpc=rpc)

    # -------------------------------------------------------------------------------- RPCs
    def Join(self, request: pb.JoinRequest, context: Any) -> pb.JoinReply:
        """Register a participant, or refuse it naming the differing config fields."""
        fields = {name: getattr(request, name) for name in JOIN_LIMITS}
        too_long = oversized_field(fields, JOIN_LIMITS)
        if too_long is not None:
            rejection = Rejection(nerr.OVERSIZED, too_long, self.transport.collecting_round)
            self._abort(context, rejection, rpc="Join")
        self._authorize(context, request.participant_id, "Join")
        # Its certificate's key signs its masked rounds' messages: kept before it counts joined.
        remember_certificate(self, request.participant_id, context)
        outcome = self.transport.join(
            request.participant_id,
            request.config_hash,
            request.config_view_json,
            request.software_version,
        )
        return pb.JoinReply(
            accepted=outcome.accepted,
            message=outcome.message,
            differing_fields=outcome.differing,
            config_hash=self.transport.config_hash,
            software_version=__version__,
            session=self.transport.session if outcome.accepted else "",
            collecting_round=outcome.collecting_round,
            round_open=outcome.round_open,
            collecting_attempt=outcome.collecting_attempt,
            already_submitted=outcome.already_submitted,
            run_over=outcome.run_over,
        )

    def WatchRounds(
        self, request: pb.WatchRoundsRequest, context: Any
    ) -> Iterator[pb.RoundAnnouncement]:
        """Stream round openings newer than the caller's last one, for one short window."""
        self._authorize(context, request.participant_id, "WatchRounds")
        self._check_session(context, request.session, "WatchRounds")
        transport = self.transport
        end = transport.now() + self.watch_window_s
        after = (request.after_round, request.after_attempt)
        while context.is_active():
            found = transport.next_announcement(after, end)
            if found is None:
                return
            opening, size = found
            if opening.final:
                yield pb.RoundAnnouncement(round_index=opening.round_index, final=True)
                return
            yield pb.RoundAnnouncement(
                round_index=opening.round_index,
                attempt=opening.attempt,
                model_version=opening.model_version,
                model_hash=opening.model_hash,
                deadline_in_s=max(0.0, opening.deadline_s - transport.now()),
                model_bytes=size,
                base_hash=opening.base_hash,
            )
            after = (opening.round_index, opening.attempt)

    def FetchModel(self, request: pb.FetchModelRequest, context: Any) -> Iterator[bytes]:
        """Stream the open round's model payload in chunks of ``network.chunk_bytes``.

        Yields serialized ``ModelChunk`` messages (the handler's serializer passes them
        through, see :func:`~lensemble.network.coordinator.server.add_service`); the first
        also names the hash and total size.
        """
        self._authorize(context, request.participant_id, "FetchModel")
        self._check_session(context, request.session, "FetchModel")
        payload = self.transport.model_payload(request.model_hash)
        if payload is None:
            rejection = Rejection(
                Reason.CLOSED_ROUND.value,
                f"model {request.model_hash[:19]}... is not the open round's model.",
                self.transport.collecting_round,
            )
            self._abort(context, rejection, rpc="FetchModel")
        # One deadline per chunk, as the participant allows itself (a large model over a
        # slow link takes many).
        extend_deadline(
            context, self.rpc_timeout_s * (chunk_count(len(payload), self.chunk_bytes) + 1)
        )
        first = pb.ModelChunk(model_hash=request.model_hash, total_bytes=len(payload))
        prefix = first.SerializeToString()
        for view in chunks(payload, self.chunk_bytes):
            if not context.is_active():
                return
            # Serialized ModelChunk frames (see serve_frames): one copy of the chunk each.
            yield with_bytes_field(prefix, MODEL_DATA_FIELD, view)
            prefix = b""
            self.transport.count_down(len(view))

    def SubmitUpdate(self, request_iterator: Iterator[UpdateFrame], context: Any) -> pb.SubmitReply:
        """Receive one pseudo-gradient stream and return the coordinator's verdict.

        The chunks arrive as :class:`~lensemble.network.shared.frames.UpdateFrame` (see
        :func:`~lensemble.network.coordinator.server.add_service`).
        """
        transport = self.transport
        rpc = "SubmitUpdate"
        first = next(request_iterator, None)
        if first is None or first.header is None:
            why = first.error if first is not None and first.error else None
            rejection = Rejection(
                Reason.BAD_PAYLOAD.value,
                why or "the update stream did not start with a header chunk.",
                transport.collecting_round,
            )
            self._abort(context, rejection, rpc=rpc)
        header = first.header
        self._authorize(context, header.participant_id, rpc)
        self._check_session(context, header.session, rpc)
        quantization = transport.config.federation.quantization
        if header.quantization != quantization:
            transport.upload_refused(
                header.participant_id, header.round_index, header.attempt, Reason.BAD_PAYLOAD.value
            )
            rejection = Rejection(
                Reason.BAD_PAYLOAD.value,
                f"the update is quantized as {header.quantization!r}, the run uses "
                f"{quantization!r}.",
                transport.collecting_round,
            )
            self._abort(context, rejection, rpc=rpc)
        early = transport.precheck(header)
        if isinstance(early, Rejection):
            self._abort(context, early, rpc=rpc)
        if isinstance(early, Verdict):
            transport.metrics.verdict(True, early.reason.value)
            return self._reply(early)
        # The header declares the size: the call may now take one deadline per chunk, plus
        # one for the coordinator's verdict.
        chunks_expected = chunk_count(min(header.total_bytes, self.max_bytes), self.chunk_bytes)
        extend_deadline(context, self.rpc_timeout_s * (chunks_expected + 2))
        if not transport.begin_upload(header.participant_id):
            rejection = Rejection(
                nerr.BUSY,
                f"another update from {header.participant_id} is still streaming.",
                transport.collecting_round,
            )
            self._abort(context, rejection, rpc=rpc)
        try:
            payload, landed = self._assemble(first, request_iterator, context)
        finally:
            transport.end_upload(header.participant_id)
        submission = Submission(
            header.participant_id,
            header.round_index,
            payload,
            header.payload_hash,
            header.attempt,
            hash_checked=True,  # _assemble hashed it while streaming and compared
            landed=landed,
        )
        del payload, landed  # the submission holds them; a refused one lets its file go
        outcome = transport.submit(submission, header.compute_s, self.rpc_timeout_s)
        if isinstance(outcome, Rejection):
            self._abort(context, outcome, rpc=rpc)
        if not outcome.accepted:
            rejection = Rejection(outcome.reason.value, outcome.message, outcome.current_round)
            self._abort(context, rejection, rpc=rpc, count=False)
        return self._reply(outcome)

    def _assemble(
        self, first: UpdateFrame, rest: Iterator[UpdateFrame], context: Any
    ) -> tuple[bytes | memoryview, Landing | None]:
        """The update's payload, received and hash-checked, and the spool file it landed in."""
        header = first.header
        assert header is not None  # SubmitUpdate refused a stream without one
        what = f"the update of {header.participant_id} for round {header.round_index}"
        current = self.transport.collecting_round

        def refused(reason: str) -> None:
            self.transport.upload_refused(
                header.participant_id, header.round_index, header.attempt, reason
            )

        try:
            assembler = Assembler(
                header.total_bytes, self.max_bytes, what, land=self.transport.intake.land
            )
        except TooLarge as exc:
            refused(Reason.TOO_LARGE.value)
            self._abort(
                context, Rejection(Reason.TOO_LARGE.value, str(exc), current), rpc="SubmitUpdate"
            )
        try:
            assembler.add(first.data)
            for chunk in rest:
                if chunk.error is not None:
                    raise PayloadError(f"{what} is malformed: {chunk.error}")
                if chunk.header is not None:
                    raise PayloadError(f"{what} carries a second header chunk.")
                self._still_collected(header, context)
                assembler.add(chunk.data)
                del chunk  # its frame goes now, not when the next one has arrived
            payload = assembler.finish()
        except PayloadError as exc:
            refused(Reason.BAD_PAYLOAD.value)
            rejection = Rejection(Reason.BAD_PAYLOAD.value, str(exc), current)
            self._abort(context, rejection, rpc="SubmitUpdate")
        except OSError as exc:  # the spool file it landed in: the coordinator's disk, not the
            # sender, so the update is not refused, only not received this time
            rejection = Rejection(
                nerr.BUSY,
                f"the coordinator could not write {what} to its spool folder "
                f"({exc.strerror or exc}); resend the same bytes.",
                current,
            )
            self._abort(context, rejection, rpc="SubmitUpdate")
        if assembler.payload_hash != header.payload_hash:
            # Hashed while streaming: a corrupt upload never reaches the coordinator's queue.
            refused(Reason.HASH_MISMATCH.value)
            rejection = Rejection(
                Reason.HASH_MISMATCH.value,
                f"payload hashes to {assembler.payload_hash[:19]}..., the sender declared "
                f"{header.payload_hash[:19]}...",
                current,
            )
            self._abort(context, rejection, rpc="SubmitUpdate")
        return payload, assembler.landing

    def _still_collected(self, header: Any, context: Any) -> None:
        """End an update stream whose attempt closed while it arrived (``closed_round``).

        Checked at every chunk, so a closed round costs at most the chunk in flight, not the
        rest of the stream. A resend of an update the closed attempt counted reads on: its
        answer stays ``duplicate``.
        """
        if self.transport.collects(header.round_index, header.attempt):
            return
        late = self.transport.precheck(header)
        if isinstance(late, Rejection):
            self._abort(context, late, rpc="SubmitUpdate")

    @staticmethod
    def _reply(verdict: Verdict) -> pb.SubmitReply:
        return pb.SubmitReply(
            accepted=verdict.accepted,
            reason=verdict.reason.value,
            message=verdict.message,
            current_round=verdict.current_round,
        )

    def Leave(self, request: pb.LeaveRequest, context: Any) -> pb.LeaveReply:
        """Record that a participant stopped."""
        self._authorize(context, request.participant_id, "Leave")
        self.transport.leave(request.participant_id, request.reason or "no reason given")
        return pb.LeaveReply()

    def Abstain(self, request: pb.AbstainRequest, context: Any) -> pb.AbstainReply:
        """Record that the caller sits out the open attempt (see ``Abstain`` in the proto).

        Hostile input until checked: the fields' sizes (``INVALID_ARGUMENT``, reason
        ``oversized_field``), the caller's own identity (``PERMISSION_DENIED``), the session
        (``FAILED_PRECONDITION``, ``stale_session``), then the reason, the attempt and what
        the caller already sent (:meth:`GrpcCoordinatorTransport.abstain`). A refusal changes
        nothing.
        """
        rpc = "Abstain"
        fields = {name: getattr(request, name) for name in ABSTAIN_LIMITS}
        too_long = oversized_field(fields, ABSTAIN_LIMITS)
        if too_long is not None:
            rejection = Rejection(nerr.OVERSIZED, too_long, self.transport.collecting_round)
            self._abort(context, rejection, rpc=rpc)
        self._authorize(context, request.participant_id, rpc)
        self._check_session(context, request.session, rpc)
        outcome = self.transport.abstain(
            request.participant_id, request.round_index, request.attempt, request.reason
        )
        if isinstance(outcome, Rejection):
            self._abort(context, outcome, rpc=rpc)
        return pb.AbstainReply(
            outcome="duplicate" if outcome.duplicate else "abstained",
            current_round=outcome.current_round,
        )

    def Presence(self, request: pb.PresenceRequest, context: Any) -> Iterator[pb.PresenceBeat]:
        """Hold the participant's presence for one window (see ``Presence`` in the proto).

        The transport counts the participant present while a stream is open; a stream that
        ends before its window is over (the participant's side went away) marks it absent at
        once.
        """
        self._authorize(context, request.participant_id, "Presence")
        self._check_session(context, request.session, "Presence")
        transport = self.transport
        pid = request.participant_id
        gone = threading.Event()
        window_over = threading.Event()

        def closed() -> None:
            # Runs once when the call ends, however it ends: before the window was over means
            # the participant's side went away.
            gone.set()
            transport.presence_closed(pid, broken=not window_over.is_set())

        transport.presence_opened(pid)
        if not context.add_callback(closed):
            closed()
            return
        end = transport.now() + self.presence_window_s
        beat_s = max(0.5, transport.config.network.keepalive_s)
        while not gone.is_set():
            yield pb.PresenceBeat(collecting_round=transport.collecting_round)
            remaining = end - transport.now()
            if remaining <= 0 or transport.stopping:
                window_over.set()
                return
            gone.wait(min(beat_s, remaining))
