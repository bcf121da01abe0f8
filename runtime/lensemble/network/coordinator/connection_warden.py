"""Per-address connection caps on the ports gRPC serves, enforced from beside gRPC.

grpc-core caps a server's connections in total (``grpc.max_allowed_incoming_connections``) but
not per peer address, and tells Python nothing when it accepts one. So one host could fill the
gRPC port's total with idle connections and keep every participant that dials anew out. The
warden looks at this process's own TCP connections a few times a second: ``/proc/self/net/tcp``
and ``tcp6`` give each connection's addresses and socket inode, ``/proc/self/fd`` maps inodes to
this process's descriptors. When one peer address holds more than its cap on a watched port,
the warden shuts down that address's newest connections (by the look that first saw each, then
by inode: the kernel numbers sockets in creation order within each CPU's batch), and gRPC,
seeing them closed, lets them go. A participant's established connection is older than any
flood against it and is kept.

Shutting down goes through a duplicate of the descriptor whose inode was checked, so a
descriptor number that gRPC closed and reused meanwhile is never touched. The warden also
counts each port's connections for the ``lensemble_connections`` metric.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from lensemble.network.shared.logs import event
from lensemble.network.shared.metrics import Metrics

_log = logging.getLogger("lensemble.network.coordinator")

#: Seconds between two looks at the connections.
SWEEP_INTERVAL_S = 0.5
#: Seconds between two warnings about the same peer address.
WARN_EVERY_S = 10.0
_TABLES = ("/proc/self/net/tcp", "/proc/self/net/tcp6")
_LISTEN = "0A"


@dataclass
class Connections:
    """One look at this process's TCP connections on the watched ports.

    Attributes:
        by_peer: ``(port, peer address)`` -> socket inodes of its connections (any order).
    """

    by_peer: dict[tuple[int, str], list[int]] = field(default_factory=dict)

    def count(self, port: int) -> int:
        """Connections on ``port``."""
        return sum(len(v) for (p, _), v in self.by_peer.items() if p == port)

    def excess(
        self, caps: Mapping[int, int], first_seen: Mapping[int, int]
    ) -> dict[tuple[int, str], list[int]]:
        """``(port, peer)`` -> its newest inodes beyond the port's cap in ``caps``.

        Args:
            caps: Port -> connections one peer may hold there (other ports are not capped).
            first_seen: Inode -> number of the look that first saw it (older looks first).
        """
        return {
            key: sorted(inodes, key=lambda i: (first_seen.get(i, 0), i))[caps[key[0]] :]
            for key, inodes in self.by_peer.items()
            if key[0] in caps and len(inodes) > caps[key[0]]
        }

    def inodes(self) -> set[int]:
        """Every connection's inode."""
        return {inode for inodes in self.by_peer.values() for inode in inodes}


def peer_text(hex_address: str) -> str:
    """An address of ``/proc/net/tcp*`` (hex, host byte order per 32-bit word) as text."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def look(ports: Mapping[int, str], tables: tuple[str, ...] = _TABLES) -> Connections:
    """This process's connections on ``ports`` (listening sockets excluded).

    A table that cannot be read (no ``/proc``, out of descriptors) is skipped.
    """
    found: dict[tuple[int, str], list[int]] = defaultdict(list)
    for table in tables:
        try:
            with open(table, encoding="ascii") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) < 10 or parts[3] == _LISTEN or parts[9] == "0":
                continue
            local_port = int(parts[1].rpartition(":")[2], 16)
            if local_port in ports:
                found[(local_port, parts[2].rpartition(":")[0])].append(int(parts[9]))
    return Connections(dict(found))


def _descriptors_of(inodes: set[int]) -> dict[int, int]:
    """Socket inode -> one of this process's descriptors for it, for ``inodes``."""
    found: dict[int, int] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        with contextlib.suppress(OSError, ValueError):
            target = os.readlink(f"/proc/self/fd/{name}")
            if target.startswith("socket:["):
                inode = int(target[8:-1])
                if inode in inodes:
                    found[inode] = int(name)
    return found


def shut_down(fd: int, inode: int) -> bool:
    """Shut the socket ``fd`` down for both directions if it is still socket ``inode``.

    Works on a duplicate whose inode is checked first, so a descriptor number closed and
    reused meanwhile is left alone. Returns True when the socket was shut down.
    """
    try:
        dup = os.dup(fd)
    except OSError:
        return False
    try:
        if os.fstat(dup).st_ino != inode:
            return False
        sock = socket.socket(fileno=dup)
        dup = -1  # the socket object owns it now
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()
        return True
    except OSError:
        return False
    finally:
        if dup >= 0:
            os.close(dup)


class ConnectionWarden:
    """Caps the connections of each peer address on gRPC's ports, and counts every port's.

    Args:
        ports: Port -> label of every port to count (``grpc``, ``download``, ``health``,
            ``metrics``).
        caps: Port -> connections one peer address may hold there, for the ports whose cap
            the warden enforces (gRPC's; the download and metrics ports enforce their own).
        metrics: Where ``lensemble_connections`` and ``..._closed_total`` are kept.
        interval_s: Seconds between two looks.
    """

    def __init__(
        self,
        ports: Mapping[int, str],
        caps: Mapping[int, int],
        metrics: Metrics,
        *,
        interval_s: float = SWEEP_INTERVAL_S,
    ) -> None:
        self.ports = dict(ports)
        self.caps = dict(caps)
        self.metrics = metrics
        self.interval_s = interval_s
        self._looks = 0
        self._first_seen: dict[int, int] = {}  # inode -> the look that first saw it
        self._warned: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="connection-warden", daemon=True)

    def start(self) -> ConnectionWarden:
        """Start looking (a daemon thread); returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop looking (bounded by one interval)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.interval_s + 1.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sweep()
            except Exception as exc:  # a bug here must not end the coordinator
                _log.error("the connection warden failed a sweep: %s", exc)

    def sweep(self) -> int:
        """Look once: count every port, shut down connections beyond the cap; returns how many."""
        seen = look(self.ports)
        self._looks += 1
        self._first_seen = {i: self._first_seen.get(i, self._looks) for i in seen.inodes()}
        for port, label in self.ports.items():
            self.metrics.connections.labels(port=label).set(seen.count(port))
        excess = seen.excess(self.caps, self._first_seen)
        if not excess:
            return 0
        wanted = {inode for inodes in excess.values() for inode in inodes}
        descriptors = _descriptors_of(wanted)
        closed = 0
        for (port, peer), inodes in excess.items():
            done = sum(
                shut_down(descriptors[inode], inode) for inode in inodes if inode in descriptors
            )
            if done:
                closed += done
                label = self.ports[port]
                self.metrics.connections_closed.labels(port=label, reason="per_address").inc(done)
                self._warn(label, self.caps[port], peer_text(peer), done)
        return closed

    def _warn(self, label: str, cap: int, peer: str, closed: int) -> None:
        now = time.monotonic()
        if now - self._warned.get(peer, -WARN_EVERY_S) < WARN_EVERY_S:
            return
        if len(self._warned) > 1024:  # many flooding addresses: forget the old warnings
            self._warned = {p: t for p, t in self._warned.items() if now - t < WARN_EVERY_S}
        self._warned[peer] = now
        event(
            _log,
            "connections_capped",
            f"{peer} held more than {cap} connections on the {label} port; closed its "
            f"{closed} newest (network.max_connections_per_address).",
            logging.WARNING,
            peer=peer,
            port=label,
            closed=closed,
        )
