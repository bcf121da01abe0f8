"""A connection flood: idle TCP connections and half-open TLS handshakes against some ports.

Each connection comes from one of several loopback source addresses (``127.0.0.2`` and up; all
of ``127.0.0.0/8`` is this host), so a per-address cap and a total cap can both be seen at work,
while honest processes keep ``127.0.0.1``. An idle connection sends nothing; a half-open TLS
handshake sends one ClientHello (made once with :class:`ssl.MemoryBIO`) and then nothing.
Connections are opened once and held, never re-opened: :meth:`Flood.still_open` tells how many
the server has not closed.
"""

from __future__ import annotations

import contextlib
import resource
import socket
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field


def client_hello() -> bytes:
    """The first flight of a TLS client handshake (a ClientHello), as bytes."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="coordinator")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def raise_own_limit(needed: int) -> None:
    """Raise this process's soft open-file limit to hold ``needed`` more sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, soft + needed + 256) if hard != resource.RLIM_INFINITY else soft + needed
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


@dataclass
class Flood:
    """Connections held against ``ports`` of ``host``.

    Attributes:
        host: The server's address.
        ports: The ports to spread the connections over (round robin).
        sources: How many source addresses to spread them over (``127.0.0.2`` onwards).
        sockets: Every connection opened and not closed by this side.
        refused: Connections that could not even be opened.
    """

    host: str
    ports: Sequence[int]
    sources: int = 8
    sockets: list[socket.socket] = field(default_factory=list)
    refused: int = 0

    def open(self, idle: int, tls: int, timeout_s: float = 2.0) -> None:
        """Open ``idle`` silent connections and ``tls`` that send a ClientHello and stop."""
        raise_own_limit(idle + tls)
        hello = client_hello()
        for n in range(idle + tls):
            port = self.ports[n % len(self.ports)]
            source = f"127.0.0.{2 + n % self.sources}"
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.settimeout(timeout_s)
            try:
                sock.bind((source, 0))
                sock.connect((self.host, port))
                if n >= idle:
                    sock.sendall(hello)
            except OSError:
                sock.close()
                self.refused += 1
                continue
            sock.setblocking(False)
            self.sockets.append(sock)

    def still_open(self) -> int:
        """Connections the server has not closed (whatever it sent before, read and dropped)."""
        return sum(_open(sock) for sock in self.sockets)

    def close(self) -> None:
        """Close every connection still held."""
        for sock in self.sockets:
            sock.close()
        self.sockets = []


def _open(sock: socket.socket) -> bool:
    """True while the peer has not closed ``sock`` (reads and drops what it sent)."""
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not data:
            return False
