"""The gRPC options of both sides: message size, keepalive, stream windows, connection limits.

The two sides must agree on them (a keepalive ping the coordinator refuses closes the
connection; a message above either side's limit fails the call), so they are derived here, from
the same config fields, for the coordinator's server (:func:`server_options`) and a
participant's channel (:func:`channel_options`).
"""

from __future__ import annotations

from typing import Any

from lensemble.config import LensembleConfig
from lensemble.network.shared.health import NO_REUSEPORT
from lensemble.network.shared.streams import grpc_message_limit


def keepalive_ms(config: LensembleConfig) -> int:
    """Keepalive ping interval and ping-answer timeout (ms) of both sides: ``keepalive_s``."""
    return max(1000, int(config.network.keepalive_s * 1000))


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


def server_options(config: LensembleConfig) -> list[tuple[str, Any]]:
    """The coordinator server's gRPC options: message size, stream window, keepalive, limits."""
    net = config.network
    ping_ms = keepalive_ms(config)
    return [
        NO_REUSEPORT,
        *message_options(config),
        # Ping every client; one that does not answer within keepalive_s is disconnected, which
        # cancels its calls (and marks the participant absent).
        ("grpc.keepalive_time_ms", ping_ms),
        ("grpc.keepalive_timeout_ms", ping_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # Accept the participants' own keepalive pings (the default refuses pings more often
        # than every 5 minutes and closes the connection).
        ("grpc.http2.min_recv_ping_interval_without_data_ms", min(ping_ms, 5000) // 2),
        ("grpc.http2.max_ping_strikes", 0),
        # Each update stream may buffer one fixed window, not what grpcio's bandwidth-delay
        # probing grows it to: tens of MB each with N uploads at once (docs/performance.md,
        # "Over the network: uploads in flight").
        ("grpc.http2.bdp_probe", 0),
        ("grpc.http2.lookahead_bytes", net.upload_window_bytes),
        # A connection with no call is closed; every connection is recycled after an age,
        # calls in flight getting one more RPC deadline (longer than a presence window).
        ("grpc.max_connection_idle_ms", int(net.max_connection_idle_s * 1000)),
        ("grpc.max_connection_age_ms", int(net.max_connection_age_s * 1000)),
        (
            "grpc.max_connection_age_grace_ms",
            int((presence_window_s(config) + 2 * net.rpc_timeout_s) * 1000),
        ),
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
        # Keepalive pings notice a dead connection (a cut link) so the next call dials anew
        # instead of waiting on TCP retransmissions.
        ("grpc.keepalive_time_ms", keepalive_ms(config)),
        ("grpc.keepalive_timeout_ms", keepalive_ms(config)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
