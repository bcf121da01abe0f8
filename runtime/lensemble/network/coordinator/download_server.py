"""The coordinator's model download port: each round's model over a TLS socket of its own.

The wire format, and why this port exists beside gRPC, are in
:mod:`lensemble.network.shared.download_protocol`. The same checks as FetchModel's, in the same
order: the caller's identity (:class:`~lensemble.network.coordinator.authenticator.Authenticator`:
the client certificate, and the bearer token with ``auth: token``), the coordinator session,
then the model hash must be the open round's. A participant may hold one download at a time and
two connections; the coordinator serves at most ``max_connections`` at once, and at most
``per_address`` from one peer address (connections beyond either are closed at once, before the
handshake). The handshake and first request must arrive within ``network.handshake_timeout_s``,
and every chunk written has a deadline of ``network.rpc_timeout_s``, so a peer that stalls or
trickles holds one slot for a bounded time and never a round. A connection that served a
download stays open for the next (within ``network.max_connection_idle_s``), as gRPC's channel
does; a refused one is closed.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from lensemble.config import LensembleConfig
from lensemble.errors import UsageError
from lensemble.federation.messages import Reason
from lensemble.network.coordinator.authenticator import Authenticator
from lensemble.network.coordinator.connection_budget import ConnectionBudget, plan_budget
from lensemble.network.shared import transport_errors as nerr
from lensemble.network.shared.download_protocol import (
    BAD_REQUEST,
    LEN32,
    MAGIC,
    MAX_REQUEST_BYTES,
    DownloadRequest,
    encode_payload_head,
    encode_refusal,
    parse_request,
    recv_exact,
)
from lensemble.network.shared.identity import COORDINATOR_IDENTITY, identity_path
from lensemble.network.shared.logs import event
from lensemble.network.shared.security import load_tls
from lensemble.network.shared.streams import chunks

_log = logging.getLogger("lensemble.network.model_download")

#: Connections one participant may hold open (a persistent one, and one to replace it).
CONNECTIONS_PER_PARTICIPANT = 2
#: The metric label of refusals here (``refused_calls_total{rpc}``).
RPC_LABEL = "ModelDownload"
#: Pause of the accept loop after a failed accept (out of descriptors), so it never spins.
ACCEPT_BACKOFF_S = 0.05


def certificate_names(peer: Mapping[str, Any] | None) -> dict[str, Collection[bytes]]:
    """A verified peer certificate (``SSLSocket.getpeercert()``) as a gRPC auth context.

    CN and every SAN value, under the keys :meth:`Authenticator.certificate_names` reads, so
    the download port decides who a caller is exactly as the gRPC port does.
    """
    if not peer:
        return {}
    common = [
        value.encode()
        for rdn in peer.get("subject", ())
        for key, value in rdn
        if key == "commonName"
    ]
    alternative = [value.encode() for _kind, value in peer.get("subjectAltName", ())]
    return {"x509_common_name": common, "x509_subject_alternative_name": alternative}


@dataclass
class _Link:
    """One accepted connection: the raw socket, its TLS stream, and whom it serves.

    Attributes:
        conn: The accepted socket.
        stream: What requests are read from: ``conn`` itself, or its TLS stream.
        address: The peer's address (IP, no port).
        holder: The participant this connection serves, once it asked; None before.
    """

    conn: socket.socket
    stream: socket.socket
    address: str
    holder: str | None = None


class ModelDownloadServer:
    """The coordinator's download port (see the module docstring).

    Args:
        transport: The coordinator transport (``model_payload``, ``session``, ``count_down``,
            ``metrics``).
        authenticator: Who callers are (the gRPC port's own).
        context: The server's TLS context, or None for plaintext (``tls.enabled: false``).
        host: Bind address (``network.listen_host``).
        port: TCP port; 0 picks a free one.
        max_connections: Connections served at once (count); one more is closed at once.
        per_address: Connections served at once from one peer address (count).
        handshake_s: Bound of the handshake plus the first request
            (``network.handshake_timeout_s``; seconds).
        timeout_s: Bound of every later request once its first byte arrived, and of every
            chunk written (seconds).
        idle_s: How long a connection that served a download may wait for the next request
            (``network.max_connection_idle_s``; seconds).
        chunk_bytes: Bytes per write (``network.chunk_bytes``).

    Raises:
        UsageError: The address cannot be bound.
    """

    def __init__(
        self,
        transport: Any,
        authenticator: Authenticator,
        context: ssl.SSLContext | None,
        *,
        host: str,
        port: int,
        max_connections: int,
        per_address: int,
        handshake_s: float,
        timeout_s: float,
        idle_s: float,
        chunk_bytes: int,
    ) -> None:
        self.transport = transport
        self.auth = authenticator
        self.context = context
        self.per_address = per_address
        self.handshake_s = handshake_s
        self.timeout_s = timeout_s
        self.idle_s = idle_s
        self.chunk_bytes = chunk_bytes
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._listener = socket.create_server((host, port), family=family, backlog=64)
        except OSError as exc:
            raise UsageError(
                f"cannot listen on {host}:{port} for the model download ({exc.strerror});",
                remediation="the port is in use or the address is not local; choose another "
                "network.download_port, or null to download over gRPC only.",
            ) from None
        self._listener.settimeout(0.2)  # how soon the accept loop notices stop()
        self.port: int = self._listener.getsockname()[1]
        self._slots = threading.BoundedSemaphore(max_connections)
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._busy: set[str] = set()  # participants with a download in flight
        self._held: dict[str, int] = {}  # participant -> connections that served it
        self._from: dict[str, int] = {}  # peer address -> connections open
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="download", daemon=True)

    def start(self) -> int:
        """Start accepting; returns the bound port."""
        self._thread.start()
        return self.port

    def stop(self) -> None:
        """Stop accepting and cut every download in flight (bounded: about 0.2 s)."""
        self._stopping.set()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):  # already closed by its peer
                    sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(2.0)
        self._listener.close()

    def _refuse(self, reason: str) -> None:
        self.transport.metrics.refused_calls.labels(rpc=RPC_LABEL, reason=reason).inc()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, address = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # out of descriptors (EMFILE) or a connection reset in the queue
                if self._stopping.wait(ACCEPT_BACKOFF_S):
                    return
                continue
            peer = str(address[0])
            if not self._admit_address(peer):
                self._refuse(nerr.BUSY)
                conn.close()
                continue
            threading.Thread(
                target=self._serve, args=(conn, peer), name="download-conn", daemon=True
            ).start()

    def _admit_address(self, peer: str) -> bool:
        """Take a slot for one more connection from ``peer``; False when a cap is reached."""
        with self._lock:
            if self._from.get(peer, 0) >= self.per_address:
                return False
            if not self._slots.acquire(blocking=False):
                return False
            self._from[peer] = self._from.get(peer, 0) + 1
        return True

    def _track(self, sock: socket.socket, add: bool) -> None:
        with self._lock:
            (self._open.add if add else self._open.discard)(sock)

    def _serve(self, conn: socket.socket, peer: str) -> None:
        link = _Link(conn, conn, peer)
        self._track(conn, True)
        try:
            # The handshake and the first request share one deadline.
            deadline = time.monotonic() + self.handshake_s
            stream = self._handshake(conn)
            if stream is None:
                return
            link.stream = stream
            self._converse(link, deadline)
        except TimeoutError:
            self._refuse(nerr.CALL_DEADLINE)
        except OSError as exc:  # the peer went away, or stop() cut the download
            _log.debug("a model download connection ended early: %s", exc)
        finally:
            self._release(link)

    def _handshake(self, conn: socket.socket) -> socket.socket | None:
        """The stream to read requests from, or None when the TLS handshake was refused."""
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.settimeout(self.handshake_s)
        if self.context is None:
            return conn
        try:
            stream = self.context.wrap_socket(conn, server_side=True)
        except TimeoutError:
            raise
        except (ssl.SSLError, OSError):
            self._refuse(nerr.BAD_CREDENTIALS)  # no, or an unverifiable, certificate
            return None
        self._track(conn, False)
        self._track(stream, True)
        return stream

    def _converse(self, link: _Link, deadline: float) -> None:
        """Answer requests on one connection until it is refused, closes or idles out."""
        while not self._stopping.is_set():
            try:
                request = self._request(link.stream, deadline)
            except (TimeoutError, ConnectionError):
                if link.holder is None:
                    raise
                return  # idle past max_connection_idle_s, or closed: the peer reconnects
            refusal = self._admit(link, request)
            if refusal is not None:
                self._refuse(refusal[0])
                link.stream.sendall(encode_refusal(*refusal))
                return  # a refused connection is closed; the peer may dial again
            assert isinstance(request, DownloadRequest)
            if not self._send(link.stream, request):
                return
            # The next request may come a round later: within max_connection_idle_s.
            deadline = time.monotonic() + self.idle_s

    def _admit(
        self, link: _Link, request: DownloadRequest | tuple[str, str]
    ) -> tuple[str, str] | None:
        """``(reason, message)`` refusing a request on ``link``, or None to answer it."""
        if isinstance(request, tuple):
            return request
        if link.holder is None:  # the first request: count the connection against its id
            refusal = self._hold(request.participant_id)
            if refusal is None:
                link.holder = request.participant_id
            return refusal
        if request.participant_id != link.holder:
            return BAD_REQUEST, "one connection downloads for one participant."
        return None

    def _release(self, link: _Link) -> None:
        """Give back what a connection held: its counts against its holder and address, its slot."""
        with self._lock:
            if link.holder is not None:
                self._held[link.holder] -= 1
            left = self._from[link.address] - 1
            if left:
                self._from[link.address] = left
            else:
                del self._from[link.address]
        self._track(link.stream, False)
        self._track(link.conn, False)
        link.stream.close()
        self._slots.release()

    def _request(self, stream: socket.socket, deadline: float) -> DownloadRequest | tuple[str, str]:
        """The next request, or ``(reason, message)`` refusing it (checked as FetchModel's)."""
        head = recv_exact(stream, len(MAGIC) + LEN32.size, deadline)
        (size,) = LEN32.unpack_from(head, len(MAGIC))
        if head[: len(MAGIC)] != MAGIC or not 1 <= size <= MAX_REQUEST_BYTES:
            return BAD_REQUEST, "not a version-1 model download request."
        # The body follows the header at once: one RPC deadline, however long the idle wait.
        body = recv_exact(stream, size, min(deadline, time.monotonic() + self.timeout_s))
        request = parse_request(body)
        if isinstance(request, str):
            return BAD_REQUEST, request
        refusal = self._check(stream, request)
        return request if refusal is None else refusal

    def _hold(self, who: str) -> tuple[str, str] | None:
        """Count a connection against ``who``: at most :data:`CONNECTIONS_PER_PARTICIPANT`."""
        with self._lock:
            if self._held.get(who, 0) >= CONNECTIONS_PER_PARTICIPANT:
                return nerr.BUSY, "this participant already holds its model download connections."
            self._held[who] = self._held.get(who, 0) + 1
        return None

    def _check(self, stream: socket.socket, request: DownloadRequest) -> tuple[str, str] | None:
        peer = stream.getpeercert() if isinstance(stream, ssl.SSLSocket) else None
        metadata = {} if request.token is None else {"authorization": f"Bearer {request.token}"}
        refused = self.auth.check(request.participant_id, certificate_names(peer), metadata)
        if refused is not None:
            return refused.reason, refused.message
        if request.session != self.transport.session:
            return nerr.STALE_SESSION, "this coordinator restarted since you joined; join again."
        return None

    def _send(self, stream: socket.socket, request: DownloadRequest) -> bool:
        """Answer one checked request; False when the connection must close."""
        who = request.participant_id
        with self._lock:
            busy = who in self._busy
            self._busy.add(who)
        if busy:  # its other connection is downloading: one download at a time
            self._refuse(nerr.BUSY)
            stream.sendall(encode_refusal(nerr.BUSY, "this participant is already downloading."))
            return False
        try:
            payload = self.transport.model_payload(request.model_hash)
            if payload is None:
                reason = Reason.CLOSED_ROUND.value
                self._refuse(reason)
                message = f"model {request.model_hash[:19]}... is not the open round's model."
                stream.sendall(encode_refusal(reason, message))
                return False
            stream.settimeout(self.timeout_s)  # per chunk: a slow link takes many
            stream.sendall(encode_payload_head(len(payload)))
            for view in chunks(payload, self.chunk_bytes):
                if self._stopping.is_set():
                    return False
                stream.sendall(view)
                self.transport.count_down(len(view))
            return True
        finally:
            with self._lock:
                self._busy.discard(who)


def server_context(config: LensembleConfig) -> ssl.SSLContext | None:
    """The coordinator's TLS context for the download port, or None when TLS is off.

    The same files as the gRPC port's credentials; a client certificate is required when
    ``network.tls.client_auth`` is on.

    Raises:
        ConfigError: A TLS file is missing or unreadable.
    """
    tls = config.network.tls
    files = load_tls(config, COORDINATOR_IDENTITY)  # raises, naming the field, when unreadable
    if files is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    cert = identity_path(tls.cert_file, COORDINATOR_IDENTITY)
    key = identity_path(tls.key_file, COORDINATOR_IDENTITY)
    assert cert is not None and key is not None  # load_tls read both
    context.load_cert_chain(cert, key)
    context.load_verify_locations(cadata=files.ca.decode("ascii", errors="replace"))
    context.verify_mode = ssl.CERT_REQUIRED if tls.client_auth else ssl.CERT_NONE
    return context


def start_model_download(
    transport: Any,
    authenticator: Authenticator,
    config: LensembleConfig,
    *,
    port: int | None,
    budget: ConnectionBudget | None = None,
) -> ModelDownloadServer | None:
    """Serve the download port when ``port`` (``network.download_port``) is set, else None.

    Args:
        transport: The coordinator transport.
        authenticator: Who callers are.
        config: The run's config.
        port: ``network.download_port`` (or an override); None serves nothing.
        budget: The port's connection caps (default: planned from this process's limit).

    Raises:
        UsageError: The port cannot be bound.
        ConfigError: A TLS file is missing or unreadable.
    """
    if port is None:
        return None
    net = config.network
    budget = budget or plan_budget(config)
    server = ModelDownloadServer(
        transport,
        authenticator,
        server_context(config),
        host=net.listen_host,
        port=port,
        max_connections=budget.download,
        per_address=budget.per_address,
        handshake_s=net.handshake_timeout_s,
        timeout_s=net.rpc_timeout_s,
        idle_s=net.max_connection_idle_s,
        chunk_bytes=net.chunk_bytes,
    )
    server.start()
    event(
        _log,
        "download_serving",
        f"serving each round's model on the download port {net.listen_host}:{server.port} "
        "(TLS as gRPC); participants that cannot reach it fetch over gRPC FetchModel.",
        download_port=server.port,
    )
    return server
