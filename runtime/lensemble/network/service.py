"""The gRPC servicer of ``lensemble.v1.Coordinator`` and the server that hosts it.

Handlers authenticate every call (:class:`~lensemble.network.security.Authenticator`), check the
coordinator session, and translate between protobuf messages and the transport. A refusal ends
the call with a gRPC status plus the trailing metadata ``lensemble-reason`` and
``lensemble-current-round``, so the participant can tell the causes apart without parsing text.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from typing import Any, NoReturn

import grpc

from lensemble import __version__
from lensemble.config import LensembleConfig
from lensemble.errors import PayloadError
from lensemble.federation.messages import Reason, Submission, Verdict
from lensemble.network import transport_errors as nerr
from lensemble.network.coordinator_transport import GrpcCoordinatorTransport, Rejection
from lensemble.network.health import NO_REUSEPORT, bind_port
from lensemble.network.peer_text import JOIN_LIMITS, oversized_field
from lensemble.network.proto import lensemble_pb2 as pb
from lensemble.network.proto import lensemble_pb2_grpc as pb_grpc
from lensemble.network.security import Authenticator
from lensemble.network.streams import Assembler, TooLarge, chunks, grpc_message_limit


def keepalive_ms(config: LensembleConfig) -> int:
    """Participants' keepalive ping interval (ms): half the RPC deadline, at least 1 s."""
    return max(1000, int(config.network.rpc_timeout_s * 500))


class _Aborted(Exception):
    """Raised by ``context.abort``; never escapes a handler."""


def message_options(config: LensembleConfig) -> list[tuple[str, Any]]:
    """Options bounding one gRPC message to a chunk plus framing (channels and servers)."""
    limit = grpc_message_limit(config.network.chunk_bytes)
    return [
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", limit),
    ]


class CoordinatorService(pb_grpc.CoordinatorServicer):
    """Handlers of the coordinator's RPCs.

    Args:
        transport: The coordinator transport the handlers feed.
        authenticator: Decides who a caller is.
    """

    def __init__(self, transport: GrpcCoordinatorTransport, authenticator: Authenticator) -> None:
        self.transport = transport
        self.auth = authenticator
        net = transport.config.network
        self.max_bytes = net.max_message_bytes
        self.chunk_bytes = net.chunk_bytes
        self.rpc_timeout_s = net.rpc_timeout_s
        # A watch stream ends on its own well within the caller's deadline; the caller
        # watches again, so no call ever waits unbounded.
        self.watch_window_s = net.rpc_timeout_s / 2

    # ------------------------------------------------------------------------------ helpers
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
        refusal = self.auth.check(
            claimed, context.auth_context(), dict(context.invocation_metadata())
        )
        if refusal is not None:
            rejection = Rejection(refusal.reason, refusal.message, self.transport.collecting_round)
            self._abort(context, rejection, rpc=rpc)

    def _check_session(self, context: Any, session: str, rpc: str) -> None:
        if session != self.transport.session:
            rejection = Rejection(
                nerr.STALE_SESSION,
                "this coordinator restarted since you joined; join again.",
                self.transport.collecting_round,
            )
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
            )
            after = (opening.round_index, opening.attempt)

    def FetchModel(self, request: pb.FetchModelRequest, context: Any) -> Iterator[pb.ModelChunk]:
        """Stream the open round's model payload in chunks of ``network.chunk_bytes``."""
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
        for index, view in enumerate(chunks(payload, self.chunk_bytes)):
            if not context.is_active():
                return
            if index == 0:
                yield pb.ModelChunk(
                    model_hash=request.model_hash, total_bytes=len(payload), data=bytes(view)
                )
            else:
                yield pb.ModelChunk(data=bytes(view))
            self.transport.count_down(len(view))

    def SubmitUpdate(
        self, request_iterator: Iterator[pb.UpdateChunk], context: Any
    ) -> pb.SubmitReply:
        """Receive one pseudo-gradient stream and return the coordinator's verdict."""
        transport = self.transport
        rpc = "SubmitUpdate"
        first = next(request_iterator, None)
        if first is None or not first.HasField("header"):
            rejection = Rejection(
                Reason.BAD_PAYLOAD.value,
                "the update stream did not start with a header chunk.",
                transport.collecting_round,
            )
            self._abort(context, rejection, rpc=rpc)
        header = first.header
        self._authorize(context, header.participant_id, rpc)
        self._check_session(context, header.session, rpc)
        quantization = transport.config.federation.quantization
        if header.quantization != quantization:
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
        if not transport.begin_upload(header.participant_id):
            rejection = Rejection(
                nerr.BUSY,
                f"another update from {header.participant_id} is still streaming.",
                transport.collecting_round,
            )
            self._abort(context, rejection, rpc=rpc)
        try:
            payload = self._assemble(first, request_iterator, context)
        finally:
            transport.end_upload(header.participant_id)
        submission = Submission(
            header.participant_id,
            header.round_index,
            payload,
            header.payload_hash,
            header.attempt,
        )
        outcome = transport.submit(submission, header.compute_s, self.rpc_timeout_s)
        if isinstance(outcome, Rejection):
            self._abort(context, outcome, rpc=rpc)
        if not outcome.accepted:
            rejection = Rejection(outcome.reason.value, outcome.message, outcome.current_round)
            self._abort(context, rejection, rpc=rpc, count=False)
        return self._reply(outcome)

    def _assemble(
        self, first: pb.UpdateChunk, rest: Iterator[pb.UpdateChunk], context: Any
    ) -> bytes:
        header = first.header
        what = f"the update of {header.participant_id} for round {header.round_index}"
        current = self.transport.collecting_round
        try:
            assembler = Assembler(header.total_bytes, self.max_bytes, what)
        except TooLarge as exc:
            self._abort(
                context, Rejection(Reason.TOO_LARGE.value, str(exc), current), rpc="SubmitUpdate"
            )
        try:
            assembler.add(first.data)
            for chunk in rest:
                if chunk.HasField("header"):
                    raise PayloadError(f"{what} carries a second header chunk.")
                assembler.add(chunk.data)
            return assembler.finish()
        except PayloadError as exc:
            rejection = Rejection(Reason.BAD_PAYLOAD.value, str(exc), current)
            self._abort(context, rejection, rpc="SubmitUpdate")

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


def start_coordinator_server(
    transport: GrpcCoordinatorTransport,
    authenticator: Authenticator,
    credentials: Any,
    *,
    host: str,
    port: int,
) -> tuple[Any, int]:
    """Serve :class:`CoordinatorService` on ``host:port``.

    Args:
        transport: The coordinator transport.
        authenticator: Who callers are.
        credentials: ``grpc.ServerCredentials``, or None for plaintext (``tls.enabled: false``).
        host: Bind address (``network.listen_host``).
        port: TCP port; 0 picks a free one.

    Returns:
        ``(server, bound port)``; the server is started.

    Raises:
        UsageError: The address cannot be bound.
    """
    n = len(transport.expected)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=3 * n + 8, thread_name_prefix="rpc"),
        options=[
            NO_REUSEPORT,
            *message_options(transport.config),
            # Accept the participants' keepalive pings (the default refuses pings more often
            # than every 5 minutes and closes the connection).
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 500),
            ("grpc.http2.max_ping_strikes", 0),
            ("grpc.keepalive_permit_without_calls", 1),
        ],
        maximum_concurrent_rpcs=3 * n + 8,
    )
    service = CoordinatorService(transport, authenticator)
    pb_grpc.add_CoordinatorServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bound = bind_port(server, target, credentials, "the coordinator's gRPC service")
    server.start()
    return server, bound
