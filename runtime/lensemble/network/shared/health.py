"""The standard gRPC health service every process serves, plaintext, on ``network.health_port``.

Kubernetes' native gRPC probes cannot speak TLS, so this port is plaintext and tells nothing but
serving status. Service ``""`` is liveness (the process serves); service ``lensemble.Readiness``
is readiness: the coordinator accepts rounds, a participant is joined. Anyone who reaches the
port may connect, so it holds at most :data:`HEALTH_CONNECTIONS` connections (one more is
closed at once; on the coordinator, at most :data:`HEALTH_PER_ADDRESS` per peer address), and
closes one that has not finished its HTTP/2 handshake within ``network.handshake_timeout_s`` or
carries no call for ``network.max_connection_idle_s``.
"""

from __future__ import annotations

from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from lensemble.errors import UsageError

LIVENESS_SERVICE = ""
READINESS_SERVICE = "lensemble.Readiness"
NO_REUSEPORT = ("grpc.so_reuseport", 0)
#: Connections the health port holds at once: probes connect, ask, and leave.
HEALTH_CONNECTIONS = 64
#: Connections one address may hold on the coordinator's health port (its warden closes the
#: newest beyond): a kubelet's probes, or a container's healthcheck, hold one or two at once,
#: so one flooding host cannot fill the port and fail the probes that keep the pod alive.
HEALTH_PER_ADDRESS = 4


def bind_port(
    server: Any, address: str, credentials: Any, what: str, choose: str = "another port"
) -> int:
    """Bind a gRPC server to ``address`` (``host:port``); returns the port actually bound.

    ``what`` names the service in the error, ``choose`` the flag and field that pick its port.

    Raises:
        UsageError: The address cannot be bound (in use, or not a local address).
    """
    try:
        port = (
            server.add_secure_port(address, credentials)
            if credentials is not None
            else server.add_insecure_port(address)
        )
    except RuntimeError:
        port = 0
    if port == 0:
        raise UsageError(
            f"cannot listen on {address} for {what};",
            remediation=f"the port is in use or the address is not local; {choose}.",
        )
    return int(port)


class HealthServer:
    """Liveness and readiness over the standard ``grpc.health.v1.Health`` service.

    Args:
        host: Bind address.
        port: TCP port; 0 picks a free one (see :attr:`port`).
        handshake_timeout_s: A connection's HTTP/2 handshake must be done within this long
            (``network.handshake_timeout_s``; seconds).
        idle_s: A connection without a call is closed after this long
            (``network.max_connection_idle_s``; seconds).

    Raises:
        UsageError: The port cannot be bound.
    """

    def __init__(
        self, host: str, port: int, *, handshake_timeout_s: float = 5.0, idle_s: float = 10.0
    ) -> None:
        self._servicer = health.HealthServicer()
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="health"),
            options=[
                NO_REUSEPORT,
                ("grpc.max_allowed_incoming_connections", HEALTH_CONNECTIONS),
                ("grpc.server_handshake_timeout_ms", int(handshake_timeout_s * 1000)),
                ("grpc.max_connection_idle_ms", int(idle_s * 1000)),
            ],
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._servicer, self._server)
        self.port = bind_port(
            self._server,
            f"{host}:{port}",
            None,
            "the health service",
            "set --health-port or network.health_port to another port (--health-port 0 picks "
            "a free one)",
        )
        self._server.start()
        self._servicer.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        self.set_ready(False)

    def set_ready(self, ready: bool) -> None:
        """Report the readiness service as SERVING or NOT_SERVING."""
        status = health_pb2.HealthCheckResponse
        self._servicer.set(READINESS_SERVICE, status.SERVING if ready else status.NOT_SERVING)

    def stop(self) -> None:
        """Report NOT_SERVING everywhere, then stop the server."""
        self._servicer.enter_graceful_shutdown()
        self._server.stop(grace=0.5)


def check(host: str, port: int, service: str, timeout_s: float) -> str:
    """Ask a health service for a status.

    The call waits for a connection until its deadline (``wait_for_ready``): a health port that
    is full for a moment (a flood of connections its warden has not trimmed yet) refuses a
    connect, and a probe should ride that out, as a kubelet's retries do, rather than report
    the process dead. A process that is down answers ``UNREACHABLE: DEADLINE_EXCEEDED`` at the
    deadline.

    Args:
        host: Host of the process.
        port: Its health port.
        service: ``""`` (liveness) or ``lensemble.Readiness``.
        timeout_s: Deadline of the call (seconds).

    Returns:
        The status name (``SERVING``, ``NOT_SERVING``, ``SERVICE_UNKNOWN``), or
        ``UNREACHABLE: <details>`` when the call failed.
    """
    target = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=service),
                timeout=timeout_s,
                wait_for_ready=True,
            )
        except grpc.RpcError as exc:
            return f"UNREACHABLE: {exc.code().name} {exc.details()}"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
