"""The ``network`` section: coordinator address, ports, TLS, authentication and limits."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from lensemble.config.sections import MiB, _Section


# ----------------------------------------------------------------------------------- network
class TLSConfig(_Section):
    """TLS material for the network transport: paths only, never key material inline."""

    enabled: bool = Field(True, description="Encrypt gRPC with TLS.")
    cert_file: str | None = Field(
        None,
        description="PEM certificate of this process (path); '{identity}' in the path becomes "
        "'coordinator' or the participant id, so one config serves every process.",
    )
    key_file: str | None = Field(
        None, description="PEM private key of this process (path); '{identity}' as for cert_file."
    )
    ca_file: str | None = Field(
        None, description="PEM CA bundle that signs the peers (path); '{identity}' as above."
    )
    client_auth: bool = Field(
        False,
        description="Mutual TLS: the coordinator requires a client certificate whose SAN or CN "
        "equals the participant id.",
    )
    expiry_warning_days: int = Field(
        30,
        ge=0,
        le=3650,
        description="Days before a certificate's expiry from which processes warn at start and "
        "`lensemble certs init` renews it (days); an expired certificate is always refused.",
    )


class NetworkConfig(_Section):
    """Coordinator address, TLS, authentication and limits of the network transport."""

    host: str = Field(
        "127.0.0.1",
        min_length=1,
        description="Host name or address participants dial to reach the coordinator.",
    )
    listen_host: str = Field(
        "127.0.0.1",
        min_length=1,
        description="Address the coordinator binds (0.0.0.0 in containers).",
    )
    port: int = Field(50051, ge=1, le=65535, description="Coordinator gRPC port (TCP).")
    health_port: int = Field(
        50052,
        ge=1,
        le=65535,
        description="Plaintext port (TCP) of the standard gRPC health service every process "
        "serves, for Kubernetes gRPC probes and container healthchecks; it reveals nothing but "
        "serving status.",
    )
    download_port: int | None = Field(
        50053,
        ge=1,
        le=65535,
        description="Coordinator port (TCP) of the model download: each round's model payload "
        "over a TLS socket of its own, beside gRPC, with the same certificates, authentication "
        "and limits, faster than gRPC's FetchModel (docs/performance.md). Participants "
        "fall back to gRPC FetchModel when it cannot be reached; null serves and uses FetchModel "
        "only.",
    )
    tls: TLSConfig = Field(default_factory=TLSConfig)
    auth: Literal["mtls", "token", "insecure"] = Field(
        "mtls",
        description="Participant authentication: 'mtls' (client certificates), 'token' "
        "(per-participant bearer tokens from token_file or LENSEMBLE_TOKEN, for development) or "
        "'insecure' (none; refused in sovereign-prod).",
    )
    token_file: str | None = Field(
        None,
        description="Path to the bearer token (participant) or to the 'id token' lines of every "
        "participant (coordinator); '{identity}' as for TLS paths. Tokens never go in the config.",
    )
    max_message_bytes: int | None = Field(
        None,
        ge=1024,
        description="Upper bound (bytes) on one FetchModel or SubmitUpdate payload, enforced "
        "before buffering. Unset: derived from the global model's wire size for "
        "federation.quantization plus header room; a value may only lower that cap, and one "
        "below the model's wire size is refused at start.",
    )
    chunk_bytes: int = Field(
        1 * MiB,
        ge=1024,
        le=64 * MiB,
        description="Bytes per streamed chunk of a model or pseudo-gradient payload.",
    )
    upload_window_bytes: int = Field(
        4 * MiB,
        ge=64 * 1024,
        le=256 * MiB,
        description="HTTP/2 flow-control window (bytes) of each update upload on the "
        "coordinator: the most one upload stream may have sent that the coordinator has not "
        "read yet. The coordinator buffers about three windows per upload in flight, so its "
        "memory grows by that much per participant uploading at once; one stream's throughput "
        "is below window / round-trip time: the default 4 MiB filled 0.6 of 1 Gbit/s at "
        "40 ms, 16 MiB (config/staging.yaml, config/sovereign-prod.yaml) 0.89 of it, at 40% "
        "more coordinator memory with 16 uploads at once on a fast LAN (docs/performance.md, "
        "'WAN links'). Keep it above twice the bandwidth-delay product of the participants' "
        "links.",
    )
    rpc_timeout_s: float = Field(
        30.0,
        ge=0.5,
        description="Deadline of every unary RPC and of each streamed chunk (seconds); at least "
        "0.5 s (a TLS handshake alone can take longer than a shorter one, and every call would "
        "fail). Must be below federation.round_timeout_s.",
    )
    connect_backoff_max_s: float = Field(
        10.0,
        gt=0.0,
        description="Cap of the exponential reconnect backoff (seconds); at most "
        "federation.join_timeout_s.",
    )
    metrics_port: int = Field(
        9090, ge=1, le=65535, description="Prometheus /metrics HTTP port (TCP)."
    )
    max_calls_per_participant: int = Field(
        4,
        ge=3,
        le=64,
        description="Concurrent RPCs one authenticated participant may hold on the coordinator "
        "(count; at most one of them an update upload); the coordinator reserves this many "
        "handler threads per participant, so no participant can starve another.",
    )
    keepalive_s: float = Field(
        10.0,
        gt=0.0,
        le=3600.0,
        description="HTTP/2 keepalive ping interval (seconds) of both sides. Must be below "
        "liveness_timeout_s, which bounds how long a ping may go unanswered.",
    )
    liveness_timeout_s: float = Field(
        20.0,
        gt=0.0,
        le=3600.0,
        description="A participant whose process stops answering (frozen, cut off, killed) is "
        "counted absent within this many seconds, and the open round closes without it: the "
        "coordinator pings every connection every keepalive_s and closes one whose ping is "
        "still unanswered liveness_timeout_s - keepalive_s later (participants treat the "
        "coordinator alike). Must exceed keepalive_s and be below federation.round_timeout_s.",
    )
    handshake_timeout_s: float = Field(
        5.0,
        gt=0.0,
        le=600.0,
        description="A new connection to any port of the coordinator (gRPC, model download, "
        "health) must finish its handshake within this many seconds (the model download: "
        "TLS and its first request), or it is closed (seconds).",
    )
    max_connections_per_address: int | None = Field(
        None,
        ge=2,
        le=65536,
        description="Connections one peer address may hold at once on each of the "
        "coordinator's ports (gRPC, model download, health; count); its newest connections "
        "beyond it are closed. Unset: 2 x the participants + 8, enough for every participant "
        "on one host. Each port's total derives from the open-file limit "
        "(docs/operations.md#file-descriptors).",
    )
    max_connection_idle_s: float = Field(
        10.0,
        gt=0.0,
        description="The coordinator closes a connection that carried no call for this long "
        "(seconds; a joined participant always holds one), and a model download connection "
        "that waits this long for its next request.",
    )
    max_connection_age_s: float = Field(
        3600.0,
        gt=0.0,
        description="The coordinator recycles every connection after this age (seconds); calls "
        "in flight get a presence window (half this age, at most 60 s) plus two rpc_timeout_s "
        "to finish, and clients reconnect on their own.",
    )
