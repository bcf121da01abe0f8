"""The gRPC options of both sides: message size, keepalive, stream windows, connection limits.

The two sides must agree on them (a keepalive ping the coordinator refuses closes the
connection; a message above either side's limit fails the call), so they are derived here, from
the same config fields, for the coordinator's server (:func:`server_options`) and a
participant's channel (:func:`channel_options`).

Liveness rests on HTTP/2 pings, which the peer's gRPC library answers from its own process: a
stopped (SIGSTOP) or cut-off process answers none, while its kernel keeps acknowledging TCP, so
TCP alone never notices. grpcio's ``keepalive_timeout_ms`` does not bound how long a ping may
go unanswered (measured with grpcio 1.85: a stopped peer stayed connected for the 60 s default
of ``grpc.http2.ping_timeout_ms``); both options are therefore set from
``network.liveness_timeout_s`` (:func:`ping_timeout_ms`).
"""

from __future__ import annotations

from typing import Any

from lensemble.config import LensembleConfig
from lensemble.network.shared.health import NO_REUSEPORT
from lensemble.network.shared.streams import grpc_message_limit


def keepalive_ms(config: LensembleConfig) -> int:
    """Keepalive ping interval (ms) of both sides: ``keepalive_s``."""
    return max(1000, int(config.network.keepalive_s * 1000))


def ping_timeout_ms(config: LensembleConfig) -> int:
    """How long a ping may go unanswered before its connection is closed (ms), both sides.

    ``liveness_timeout_s - keepalive_s``: a peer that stops answering sends nothing more, so
    the next ping leaves within ``keepalive_s`` and its connection closes within
    ``liveness_timeout_s`` of the last thing it sent. At least one second.
    """
    net = config.network
    return max(1000, int((net.liveness_timeout_s - net.keepalive_s) * 1000))


def liveness_options(config: LensembleConfig) -> list[tuple[str, Any]]:
    """Keepalive pings every ``keepalive_s``, each answered within :func:`ping_timeout_ms`."""
    answer_ms = ping_timeout_ms(config)
    return [
        ("grpc.keepalive_time_ms", keepalive_ms(config)),
        ("grpc.keepalive_timeout_ms", answer_ms),
        ("grpc.http2.ping_timeout_ms", answer_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def presence_window_s(config: LensembleConfig) -> float:
    """How long one Presence stream lasts before the participant opens the next (seconds)."""
    return max(1.0, min(60.0, config.network.max_connection_age_s / 2))


def message_options(config: LensembleConfig) -> list[tuple[str, Any]]:
    """Options bounding one gRPC message to a chunk plus framing (channels and servers)."""
    limit = grpc_message_limit(config.network.chunk_bytes)
    return [
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", limit),
    ]


def server_options(config: LensembleConfig, max_connections: int) -> list[tuple[str, Any]]:
    """The coordinator server's gRPC options: message size, stream window, keepalive, limits.

    Args:
        config: The run's config.
        max_connections: Connections the server holds at once, handshakes included (count;
            from the coordinator's descriptor budget): one more is closed at once.
    """
    net = config.network
    ping_ms = keepalive_ms(config)
    return [
        NO_REUSEPORT,
        *message_options(config),
        # Ping every client; one that leaves a ping unanswered for ping_timeout_ms is
        # disconnected, which cancels its calls (and marks the participant absent).
        *liveness_options(config),
        # Accept the participants' own keepalive pings (the default refuses pings more often
        # than every 5 minutes and closes the connection).
        ("grpc.http2.min_recv_ping_interval_without_data_ms", min(ping_ms, 5000) // 2),
        ("grpc.http2.max_ping_strikes", 0),
        # Each update stream may buffer one fixed window, not what grpcio's bandwidth-delay
        # probing grows it to: tens of MB each with N uploads at once (docs/performance.md,
        # "Over the network: uploads in flight").
        ("grpc.http2.bdp_probe", 0),
        ("grpc.http2.lookahead_bytes", net.upload_window_bytes),
        *connection_limits(config, max_connections),
        # Every connection is recycled after an age, calls in flight getting one more RPC
        # deadline (longer than a presence window).
        ("grpc.max_connection_age_ms", int(net.max_connection_age_s * 1000)),
        (
            "grpc.max_connection_age_grace_ms",
            int((presence_window_s(config) + 2 * net.rpc_timeout_s) * 1000),
        ),
    ]


def connection_limits(config: LensembleConfig, max_connections: int) -> list[tuple[str, Any]]:
    """What a gRPC server of the coordinator's holds: connections, handshakes, idle ones.

    A connection beyond ``max_connections`` is closed as it is accepted (the open-file limit
    is never reached); one whose TLS (or plaintext HTTP/2) handshake is not done within
    ``network.handshake_timeout_s`` is closed, as is one that carries no call for
    ``network.max_connection_idle_s``.
    """
    net = config.network
    return [
        ("grpc.max_allowed_incoming_connections", max_connections),
        ("grpc.server_handshake_timeout_ms", int(net.handshake_timeout_s * 1000)),
        ("grpc.max_connection_idle_ms", int(net.max_connection_idle_s * 1000)),
    ]


def channel_options(config: LensembleConfig) -> list[tuple[str, Any]]:
    """A participant's channel options: message size, reconnect backoff, keepalive."""
    backoff_ms = int(config.network.connect_backoff_max_s * 1000)
    return [
        *message_options(config),
        # gRPC's own reconnect backoff must not outgrow ours (its default cap is 120 s).
        ("grpc.initial_reconnect_backoff_ms", min(1000, backoff_ms)),
        ("grpc.min_reconnect_backoff_ms", min(1000, backoff_ms)),
        ("grpc.max_reconnect_backoff_ms", backoff_ms),
        # Keepalive pings notice a dead, frozen or cut-off coordinator within
        # liveness_timeout_s, so the next call dials anew instead of waiting on TCP.
        *liveness_options(config),
    ]
