"""The HTTP endpoint that serves one process's metrics at ``observability.metrics_path``.

A scraper (Prometheus) or anyone who can reach ``network.metrics_port`` may connect, so the
server bounds what a client can hold, and no client can keep a scrape out:

- every connection has a deadline: :data:`READ_TIMEOUT_S` after it was accepted it is closed,
  whatever it sends (a scrape takes milliseconds; a client trickling a byte at a time would
  otherwise never trip a per-read timeout);
- at most :data:`MAX_CONNECTIONS` connections are served at once, each in one thread; a new
  connection beyond that takes the slot of one still sending its request, the oldest of the
  address holding the most such connections, so one address flooding the port only ever
  evicts its own connections and a scraper from elsewhere always gets in. A connection whose
  request is complete is never evicted.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from socketserver import TCPServer
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app

from lensemble.errors import UsageError

_log = logging.getLogger("lensemble.network.metrics")

#: Seconds a metrics connection may stay open, from accept to its last byte.
READ_TIMEOUT_S = 5.0
#: Most metrics connections served at once (a newcomer evicts one still sending its request).
MAX_CONNECTIONS = 16


class _QuietHandler(WSGIRequestHandler):
    # A read timeout on every read too: the deadline below bounds the whole connection.
    timeout = READ_TIMEOUT_S

    def parse_request(self) -> bool:
        """Parse the request; once it is complete its connection can no longer be evicted."""
        complete = super().parse_request()
        if complete:
            server = self.server
            assert isinstance(server, _BoundedServer)
            server.connections.served(self.request)
        return complete

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not worth a log line."""


@dataclass
class _Open:
    """One connection being served."""

    address: str
    deadline: float  # time.monotonic() when it is closed
    reading: bool = True  # still sending its request (evictable)


class _Connections:
    """The connections being served: at most ``cap``, each closed at its deadline.

    Closing means ``shutdown``: the connection's thread then reads end-of-file, or fails to
    write, and ends; the slot is free at once.

    Args:
        cap: Most connections at once.
        deadline_s: Seconds from admission until a connection is closed.
    """

    def __init__(self, cap: int, deadline_s: float) -> None:
        self.cap, self.deadline_s = cap, deadline_s
        self._open: dict[socket.socket, _Open] = {}  # insertion order: oldest first
        self._changed = threading.Condition()
        self._stopped = False

    def admit(self, sock: socket.socket, address: str) -> bool:
        """Take a slot for ``sock``, evicting a connection still reading when all are taken.

        Returns:
            False when every slot holds a connection whose request is complete (then the
            caller closes ``sock``).
        """
        with self._changed:
            if len(self._open) >= self.cap:
                victim = self._victim()
                if victim is None:
                    return False
                self._close(victim)
            self._open[sock] = _Open(address, time.monotonic() + self.deadline_s)
            self._changed.notify()
            return True

    def served(self, sock: socket.socket) -> None:
        """``sock``'s request is complete: it keeps its slot until it is answered."""
        with self._changed:
            entry = self._open.get(sock)
            if entry is not None:
                entry.reading = False

    def release(self, sock: socket.socket) -> None:
        """``sock``'s thread is done with it."""
        with self._changed:
            self._open.pop(sock, None)

    def _victim(self) -> socket.socket | None:
        """The oldest connection still reading of the address with the most of them."""
        reading = [(sock, entry) for sock, entry in self._open.items() if entry.reading]
        if not reading:
            return None
        counts = Counter(entry.address for _, entry in reading)
        heaviest = max(counts.values())
        return next(sock for sock, entry in reading if counts[entry.address] == heaviest)

    def _close(self, sock: socket.socket) -> None:
        self._open.pop(sock, None)
        with contextlib.suppress(OSError):  # already gone
            sock.shutdown(socket.SHUT_RDWR)

    def reap(self) -> None:
        """Close every connection at its deadline, until :meth:`stop` (runs in a thread)."""
        with self._changed:
            while not self._stopped:
                now = time.monotonic()
                for sock in [s for s, e in self._open.items() if e.deadline <= now]:
                    self._close(sock)
                due = min((e.deadline for e in self._open.values()), default=None)
                self._changed.wait(None if due is None else max(0.0, due - now))

    def stop(self) -> None:
        """End :meth:`reap`."""
        with self._changed:
            self._stopped = True
            self._changed.notify()


class _BoundedServer(WSGIServer):
    """A WSGI server with one daemon thread per connection, at most ``max_connections``.

    The standard ``ThreadingMixIn`` starts a thread for every connection and never bounds
    them: 500 half-sent requests were 500 threads. Here :class:`_Connections` holds the slots
    and closes each connection at its deadline.
    """

    # A burst of scrapers (or of attackers) waits in the kernel, not in threads.
    request_queue_size = 128

    def __init__(
        self,
        *args: Any,
        max_connections: int = MAX_CONNECTIONS,
        deadline_s: float = READ_TIMEOUT_S,
        **kw: Any,
    ) -> None:
        self.connections = _Connections(max_connections, deadline_s)
        super().__init__(*args, **kw)
        self._reaper = threading.Thread(
            target=self.connections.reap, name="metrics-deadlines", daemon=True
        )
        self._reaper.start()

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the bind address with socket.getfqdn: a reverse DNS
        # query that can stall start-up where no resolver is reachable. Nothing needs the name.
        TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)
        self.setup_environ()

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve the connection in a daemon thread when it gets a slot, else close it."""
        if not self.connections.admit(request, str(client_address[0])):
            self.shutdown_request(request)
            return
        thread = threading.Thread(
            target=self._serve, args=(request, client_address), name="metrics-conn", daemon=True
        )
        thread.start()

    def _serve(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception as exc:  # a client that disconnected, stalled or was evicted
            _log.debug("metrics connection from %s ended: %s", client_address, exc)
        finally:
            self.connections.release(request)
            self.shutdown_request(request)

    def server_close(self) -> None:
        """Close the socket and stop closing connections at their deadlines."""
        self.connections.stop()
        super().server_close()


def _only_path(path: str, app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    def routed(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "") != path:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [f"metrics are at {path}\n".encode()]
        return app(environ, start_response)

    return routed


class MetricsServer:
    """HTTP server exposing one registry at one path, in a daemon thread.

    At most ``max_connections`` clients are served at once, each in its own thread; every
    connection is closed ``read_timeout_s`` after it was accepted; a new connection beyond the
    cap evicts one still sending its request (see the module docstring).

    Args:
        registry: What to expose.
        host: Bind address.
        port: TCP port; 0 picks a free one (see :attr:`port`).
        path: URL path (``observability.metrics_path``).
        read_timeout_s: Deadline of each connection, from accept to its last byte (seconds).
        max_connections: Most connections served at once.

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
            self._server = _BoundedServer(
                (host, port), handler, max_connections=max_connections, deadline_s=read_timeout_s
            )
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
