"""Prometheus metrics of one process, served over HTTP at ``observability.metrics_path``.

Every process (coordinator or participant) has its own registry with the same metric names;
a metric a role does not use stays at zero. Names (all prefixed ``lensemble_``):

======================================  ===============================================
``round_index``                         round being collected (coordinator) or trained
``round_attempt``                       attempt of that round
``round_state``                         round state machine (an enum metric)
``round_contributors``                  contributors of the last closed attempt
``participants_joined``                 participants joined (coordinator)
``joined``                              1 while joined to the coordinator (participant)
``rounds_total{state}``                 closed / aborted round attempts
``bytes_in_total``, ``bytes_out_total`` payload bytes received / sent
``round_duration_seconds``              wall time of each round attempt
``round_non_compute_seconds``           round wall time minus inner-step time
``compute_seconds``                     inner-step time per round (participant)
``accepted_submissions_total``          updates accepted (including idempotent resends)
``rejected_submissions_total{reason}``  updates rejected, by reason
``refused_calls_total{rpc,reason}``     other calls refused (Join, WatchRounds, ...)
======================================  ===============================================
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from socketserver import TCPServer
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram, make_wsgi_app

from lensemble.errors import UsageError
from lensemble.federation.rounds import RoundState

_log = logging.getLogger("lensemble.network.metrics")
_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class Metrics:
    """The metrics of one process, on a private registry.

    Args:
        registry: Where to register (a new private registry by default).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.round_index = Gauge(
            "lensemble_round_index", "Round being collected or trained.", registry=r
        )
        self.round_attempt = Gauge("lensemble_round_attempt", "Attempt of that round.", registry=r)
        self.round_state = Enum(
            "lensemble_round_state",
            "State of the current round attempt.",
            states=[s.value for s in RoundState],
            registry=r,
        )
        self.round_contributors = Gauge(
            "lensemble_round_contributors", "Contributors of the last closed attempt.", registry=r
        )
        self.participants_joined = Gauge(
            "lensemble_participants_joined", "Participants joined to the coordinator.", registry=r
        )
        self.joined = Gauge(
            "lensemble_joined", "1 while this participant is joined to the coordinator.", registry=r
        )
        self.rounds = Counter(
            "lensemble_rounds", "Round attempts by final state.", ["state"], registry=r
        )
        self.bytes_in = Counter("lensemble_bytes_in", "Payload bytes received.", registry=r)
        self.bytes_out = Counter("lensemble_bytes_out", "Payload bytes sent.", registry=r)
        self.round_duration = Histogram(
            "lensemble_round_duration_seconds",
            "Wall time of each round attempt (seconds).",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.round_non_compute = Histogram(
            "lensemble_round_non_compute_seconds",
            "Round wall time minus the inner-step time on its critical path (seconds).",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.compute = Histogram(
            "lensemble_compute_seconds",
            "Inner-step time per round (seconds).",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.accepted = Counter("lensemble_accepted_submissions", "Updates accepted.", registry=r)
        self.rejected = Counter(
            "lensemble_rejected_submissions", "Updates rejected, by reason.", ["reason"], registry=r
        )
        self.refused_calls = Counter(
            "lensemble_refused_calls",
            "Calls other than SubmitUpdate refused, by RPC and reason.",
            ["rpc", "reason"],
            registry=r,
        )

    def verdict(self, accepted: bool, reason: str) -> None:
        """Count one judged update."""
        if accepted:
            self.accepted.inc()
        else:
            self.rejected.labels(reason=reason).inc()


#: Seconds a metrics client may take to send each part of its request before it is dropped.
READ_TIMEOUT_S = 5.0
#: Most metrics connections served at once; more are closed at once (a scraper retries).
MAX_CONNECTIONS = 16


class _QuietHandler(WSGIRequestHandler):
    # A read timeout on every connection: a client that stops sending loses its slot.
    timeout = READ_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not worth a log line."""


class _BoundedServer(WSGIServer):
    """A WSGI server with one daemon thread per connection, at most ``max_connections``.

    The standard ``ThreadingMixIn`` starts a thread for every connection and never bounds
    them: 500 half-sent requests were 500 threads. Here a connection beyond the cap is closed
    without a thread, and each connection's reads time out (``handler.timeout``).
    """

    # A burst of scrapers (or of attackers) waits in the kernel, not in threads.
    request_queue_size = 128

    def __init__(self, *args: Any, max_connections: int = MAX_CONNECTIONS, **kw: Any) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(*args, **kw)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the bind address with socket.getfqdn: a reverse DNS
        # query that can stall start-up where no resolver is reachable. Nothing needs the name.
        TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)
        self.setup_environ()

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve the connection in a daemon thread when a slot is free, else close it."""
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        thread = threading.Thread(
            target=self._serve, args=(request, client_address), name="metrics-conn", daemon=True
        )
        thread.start()

    def _serve(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception as exc:  # a client that disconnected or stalled: not worth a warning
            _log.debug("metrics connection from %s ended: %s", client_address, exc)
        finally:
            self.shutdown_request(request)
            self._slots.release()


def _only_path(path: str, app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    def routed(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "") != path:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [f"metrics are at {path}\n".encode()]
        return app(environ, start_response)

    return routed


class MetricsServer:
    """HTTP server exposing one registry at one path, in a daemon thread.

    At most ``max_connections`` clients are served at once, each in its own thread; a client
    that sends nothing for ``read_timeout_s`` is disconnected.

    Args:
        registry: What to expose.
        host: Bind address.
        port: TCP port; 0 picks a free one (see :attr:`port`).
        path: URL path (``observability.metrics_path``).
        read_timeout_s: Longest wait for each read from a client (seconds).
        max_connections: Most connections served at once; more are closed at once.

    Raises:
        UsageError: The port cannot be bound.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        path: str,
        *,
        read_timeout_s: float = READ_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        app = _only_path(path, make_wsgi_app(registry))
        handler = type("_Handler", (_QuietHandler,), {"timeout": read_timeout_s})
        try:
            self._server = _BoundedServer((host, port), handler, max_connections=max_connections)
            self._server.set_app(app)
        except OSError as exc:
            raise UsageError(
                f"cannot serve metrics on {host}:{port} ({exc.strerror});",
                remediation="choose another network.metrics_port, or --metrics-port 0 for a free "
                "one.",
            ) from None
        self.port: int = self._server.server_port
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="metrics-http", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()
