"""The coordinator's gRPC server: the servicer behind the call guard, on one port.

Every method is registered as the generated code registers it, except the two payload streams,
whose frames skip protobuf's copies (:mod:`lensemble.network.shared.frames`). The server's
thread pool holds every participant's allowance plus a few spare threads
(:func:`~lensemble.network.coordinator.call_guard.pool_size`), and the call guard sets each
call's server-side deadline (:func:`call_policy`). The server holds at most the connections its
share of the open-file budget allows
(:mod:`~lensemble.network.coordinator.connection_budget`).
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent import futures
from typing import Any

import grpc

from lensemble.config import LensembleConfig
from lensemble.federation.payload import TensorSpec
from lensemble.network.coordinator.authenticator import Authenticator
from lensemble.network.coordinator.call_guard import CallGuard, CallPolicy, pool_size
from lensemble.network.coordinator.connection_budget import ConnectionBudget, plan_budget
from lensemble.network.coordinator.masking_service import MaskingService
from lensemble.network.coordinator.service import CoordinatorService
from lensemble.network.coordinator.transport import GrpcCoordinatorTransport
from lensemble.network.shared.frames import SERVICE_NAME, parse_update_frame, passthrough
from lensemble.network.shared.grpc_options import presence_window_s, server_options
from lensemble.network.shared.health import bind_port
from lensemble.network.shared.masking_limits import answer_limits
from lensemble.network.shared.payload_limits import payload_limits
from lensemble.network.shared.proto import lensemble_pb2_grpc as pb_grpc
from lensemble.network.shared.streams import chunk_count


def call_policy(config: LensembleConfig) -> CallPolicy:
    """Server-side deadlines of every RPC (seconds) and the per-participant allowance.

    Unary calls and the start of an upload get ``rpc_timeout_s``; a watch one more than its
    window; a presence stream one more than its window; an upload is extended once its header
    declares the size (see :meth:`CoordinatorService.SubmitUpdate`), and a model download once
    the model's size is known, both to ``rpc_timeout_s`` per chunk plus one.
    """
    net = config.network
    return CallPolicy(
        per_participant=net.max_calls_per_participant,
        deadline_s={
            "WatchRounds": net.rpc_timeout_s * 1.5,
            "Presence": presence_window_s(config) + net.rpc_timeout_s,
            # A stage stream's window is rpc_timeout_s (MaskingService); an answer upload is
            # extended once its header declares the size.
            "MaskingStages": net.rpc_timeout_s * 2,
        },
        default_deadline_s=net.rpc_timeout_s,
    )


class _Handlers:
    """Receives the method handlers the generated ``add_CoordinatorServicer_to_server`` makes."""

    def __init__(self) -> None:
        self.handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, name: str, handlers: dict[str, Any]) -> None:
        self.handlers = dict(handlers)


def add_service(
    service: CoordinatorService, server: Any, masking: MaskingService | None = None
) -> None:
    """Register ``service`` on ``server`` as the generated code does, FetchModel's frames as is.

    ``FetchModel`` yields serialized ``ModelChunk`` frames (:func:`streams.with_bytes_field`),
    so its response serializer passes bytes through; ``SubmitUpdate`` reads its chunks with
    :func:`parse_update_frame` (the data as a view of the frame); the masked rounds' two
    methods are ``masking``'s handlers (UNIMPLEMENTED without it); every other method keeps the
    generated protobuf handlers.
    """
    collected = _Handlers()
    pb_grpc.add_CoordinatorServicer_to_server(service, collected)  # type: ignore[no-untyped-call]
    handlers = collected.handlers
    generated = handlers["FetchModel"]
    handlers["FetchModel"] = grpc.unary_stream_rpc_method_handler(
        service.FetchModel,
        request_deserializer=generated.request_deserializer,
        response_serializer=passthrough,
    )
    handlers["SubmitUpdate"] = grpc.stream_unary_rpc_method_handler(
        service.SubmitUpdate,
        request_deserializer=parse_update_frame,
        response_serializer=handlers["SubmitUpdate"].response_serializer,
    )
    if masking is not None:
        handlers["MaskingStages"] = grpc.unary_stream_rpc_method_handler(
            masking.MaskingStages,
            request_deserializer=handlers["MaskingStages"].request_deserializer,
            response_serializer=handlers["MaskingStages"].response_serializer,
        )
        handlers["AnswerStage"] = grpc.stream_unary_rpc_method_handler(
            masking.AnswerStage,
            request_deserializer=handlers["AnswerStage"].request_deserializer,
            response_serializer=handlers["AnswerStage"].response_serializer,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def start_coordinator_server(
    transport: GrpcCoordinatorTransport,
    authenticator: Authenticator,
    credentials: Any,
    *,
    host: str,
    port: int,
    architecture: Mapping[str, TensorSpec],
    budget: ConnectionBudget | None = None,
) -> tuple[Any, int]:
    """Serve :class:`CoordinatorService` on ``host:port`` behind the call guard.

    Args:
        transport: The coordinator transport.
        authenticator: Who callers are.
        credentials: ``grpc.ServerCredentials``, or None for plaintext (``tls.enabled: false``).
        host: Bind address (``network.listen_host``).
        port: TCP port; 0 picks a free one.
        architecture: The global model's parameters (name -> spec): sets the update cap.
        budget: The port's connection cap (default: planned from this process's limit).

    Returns:
        ``(server, bound port)``; the server is started.

    Raises:
        UsageError: The address cannot be bound.
        ConfigError: ``network.max_message_bytes`` is below the model's wire size.
    """
    config = transport.config
    limits = payload_limits(config, architecture)
    service = CoordinatorService(transport, authenticator, limits.update_bytes)
    stage_limits = answer_limits(config, architecture)
    masking = MaskingService(service, stage_limits)
    net = config.network
    transport.masking.mask_timeout_s = net.rpc_timeout_s * (
        chunk_count(stage_limits["mask"], net.chunk_bytes) + 2
    )
    policy = call_policy(config)

    def refuse(
        context: Any, reason: str, message: str, status: grpc.StatusCode, method: str
    ) -> None:
        service.refuse(context, reason, message, status, method)

    guard = CallGuard(authenticator, policy, refuse)
    size = pool_size(len(transport.expected), policy.per_participant)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=size, thread_name_prefix="rpc"),
        interceptors=[guard],
        options=server_options(config, (budget or plan_budget(config)).grpc),
        maximum_concurrent_rpcs=size,
    )
    add_service(service, server, masking)
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bound = bind_port(
        server,
        target,
        credentials,
        "the coordinator's gRPC service",
        "set --port or network.port to another port (--port 0 picks a free one)",
    )
    server.start()
    return server, bound
