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

import threading
from collections.abc import Callable, Iterable
from socketserver import TCPServer, ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram, make_wsgi_app

from lensemble.errors import UsageError
from lensemble.federation.rounds import RoundState

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


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not worth a log line."""


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the bind address with socket.getfqdn: a reverse DNS
        # query that can stall start-up where no resolver is reachable. Nothing needs the name.
        TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)
        self.setup_environ()


def _only_path(path: str, app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    def routed(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "") != path:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [f"metrics are at {path}\n".encode()]
        return app(environ, start_response)

    return routed


class MetricsServer:
    """HTTP server exposing one registry at one path, in a daemon thread.

    Args:
        registry: What to expose.
        host: Bind address.
        port: TCP port; 0 picks a free one (see :attr:`port`).
        path: URL path (``observability.metrics_path``).

    Raises:
        UsageError: The port cannot be bound.
    """

    def __init__(self, registry: CollectorRegistry, host: str, port: int, path: str) -> None:
        app = _only_path(path, make_wsgi_app(registry))
        try:
            self._server = make_server(
                host, port, app, server_class=_ThreadingServer, handler_class=_QuietHandler
            )
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
