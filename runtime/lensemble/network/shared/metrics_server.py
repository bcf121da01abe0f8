"""The HTTP endpoint that serves one process's metrics at ``observability.metrics_path``.

A scraper (Prometheus) or anyone who can reach ``network.metrics_port`` may connect, so the
server bounds what a client can hold: at most :data:`MAX_CONNECTIONS` connections at once, each
in one thread (more are closed at once), and a client that sends nothing for
:data:`READ_TIMEOUT_S` is dropped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from socketserver import TCPServer
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app

from lensemble.errors import UsageError

_log = logging.getLogger("lensemble.network.metrics")

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
