"""The metrics HTTP server under half-sent requests, over real sockets.

On main it started one thread per connection with no read timeout: 500 half-sent requests made
513 threads, each waiting forever.
"""

from __future__ import annotations

import select
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest

from lensemble.network.shared.metrics import Metrics
from lensemble.network.shared.metrics_server import MetricsServer

CAP = 8


def _server(read_timeout_s: float) -> MetricsServer:
    metrics = Metrics()
    metrics.round_index.set(7)
    return MetricsServer(
        metrics.registry,
        "127.0.0.1",
        0,
        "/metrics",
        read_timeout_s=read_timeout_s,
        max_connections=CAP,
    )


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    served = _server(read_timeout_s=0.5)
    yield served
    served.stop()


def _half_sent(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # no blank line: never finished
    return sock


def _scrape(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return reply.read()  # type: ignore[no-any-return]


def _connection_threads() -> int:
    return sum(t.name == "metrics-conn" for t in threading.enumerate())


def _closed_by_server(socks: list[socket.socket], count: int, within_s: float) -> set[int]:
    """Indices of sockets the server closed, once ``count`` of them are (or at the deadline)."""
    closed: set[int] = set()
    deadline = time.monotonic() + within_s
    while len(closed) < count and time.monotonic() < deadline:
        open_ = [s for i, s in enumerate(socks) if i not in closed]
        readable, _, _ = select.select(open_, [], [], max(0.0, deadline - time.monotonic()))
        for sock in readable:
            try:
                data = sock.recv(1)
            except ConnectionResetError:
                data = b""
            if data == b"":
                closed.add(socks.index(sock))
    return closed


def test_500_half_sent_requests_take_at_most_the_cap_in_threads() -> None:
    server = _server(read_timeout_s=60)  # nobody is timed out during the test
    socks: list[socket.socket] = []
    try:
        for _ in range(500):
            socks.append(_half_sent(server.port))
        closed = _closed_by_server(socks, len(socks) - CAP, within_s=30)
        assert len(closed) == len(socks) - CAP, "connections beyond the cap were kept open"
        assert _connection_threads() == CAP
    finally:
        for sock in socks:
            sock.close()
        server.stop()


def test_a_stalled_client_is_dropped_after_the_read_timeout(server: MetricsServer) -> None:
    sock = _half_sent(server.port)
    try:
        assert _closed_by_server([sock], 1, within_s=10) == {0}
    finally:
        sock.close()


def test_scrapes_work_before_and_after_the_slots_were_taken(server: MetricsServer) -> None:
    assert b"lensemble_round_index 7.0" in _scrape(server.port)
    socks = [_half_sent(server.port) for _ in range(CAP)]
    try:
        # The server drops the stalled clients at its read timeout; then scraping works again.
        assert len(_closed_by_server(socks, CAP, within_s=10)) == CAP
        assert b"lensemble_round_index 7.0" in _scrape(server.port)
    finally:
        for sock in socks:
            sock.close()
