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
        # The threads of evicted connections end once they read the end of their connection.
        deadline = time.monotonic() + 10
        while _connection_threads() > CAP and time.monotonic() < deadline:
            time.sleep(0.01)
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


# ------------------------------------------------------------ slow senders never block a scrape
def _half_sent_from(port: int, source: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    return sock


def test_a_trickling_sender_is_dropped_at_its_deadline(server: MetricsServer) -> None:
    """One byte every 0.1 s never trips a per-read timeout of 0.5 s; the deadline drops it."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sent = 0
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                sock.sendall(b"X-Slow: " if sent == 0 else b"a")
            except OSError:  # reset: the server closed it
                break
            sent += 1
            if _closed_by_server([sock], 1, within_s=0.1):
                break
        else:
            pytest.fail("a client that kept sending a byte every 0.1 s was never dropped")
    finally:
        sock.close()


def test_slow_senders_holding_every_slot_never_block_a_scrape() -> None:
    server = _server(read_timeout_s=60)  # nobody is timed out during the test
    socks = [_half_sent_from(server.port, "127.0.0.2") for _ in range(CAP)]
    try:
        assert not _closed_by_server(socks, 1, within_s=0.2)  # they hold every slot
        for _ in range(3):
            assert b"lensemble_round_index 7.0" in _scrape(server.port)
        assert _closed_by_server(socks, 1, within_s=10)  # a scrape took a slow sender's slot
    finally:
        for sock in socks:
            sock.close()
        server.stop()


def test_a_flood_of_connections_from_one_address_never_blocks_a_scrape_from_another() -> None:
    server = _server(read_timeout_s=60)
    stop = threading.Event()
    flood: list[socket.socket] = []

    def flooding() -> None:
        while not stop.is_set() and len(flood) < 400:
            try:
                flood.append(_half_sent_from(server.port, "127.0.0.3"))
            except OSError:
                continue

    attacker = threading.Thread(target=flooding, daemon=True)
    attacker.start()
    try:
        while len(flood) < CAP and attacker.is_alive():
            time.sleep(0.01)  # waits for the slots to be full (not a timing assert)
        for _ in range(20):
            assert b"lensemble_round_index 7.0" in _scrape(server.port)
    finally:
        stop.set()
        attacker.join(timeout=30)
        for sock in flood:
            sock.close()
        server.stop()
