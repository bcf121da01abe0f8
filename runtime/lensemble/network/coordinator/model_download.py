"""The model download: each round's model payload over a TLS socket of its own, beside gRPC.

Why a second port: grpcio streams a payload through HTTP/2 frames, its own slices and a handoff
to a Python thread per message, and on loopback its FetchModel ran at 0.68-0.76 x what a raw
TLS socket moves between the same two processes (``docs/performance.md``, *The network path*).
Here the coordinator writes views of the round's cached payload straight into a TLS socket, and
the participant reads them straight into the ``bytes`` object it hands on (recycled, see
:mod:`lensemble.machinery.fresh_bytes`): the raw socket's own path. gRPC still carries
everything else, and a participant that cannot use this port downloads over FetchModel.

The same checks as FetchModel's, in the same order: the caller's identity
(:class:`~lensemble.network.shared.security.Authenticator`: the client certificate, and the bearer
token with ``auth: token``), the coordinator session, then the model hash must be the open
round's. A participant may hold one download at a time and two connections; the coordinator
serves at most ``max_connections`` at once (connections beyond it are closed at once, before
the handshake). The handshake and first request must arrive within ``network.rpc_timeout_s``, and
every chunk written has that deadline, so a peer that stalls or trickles holds one slot for a
bounded time and never a round. A connection that served a download stays open for the next
(within ``network.max_connection_idle_s``), as gRPC's channel does; a refused one is closed.

Wire format, version 1 (integers big-endian):

- request, participant to coordinator, after the TLS handshake: :data:`MAGIC`, a ``u32``
  length ``n`` (1 to :data:`MAX_REQUEST_BYTES`), then ``n`` bytes of a JSON object with the
  string fields ``participant_id``, ``session``, ``model_hash`` and, with ``auth: token`` only,
  ``token``. Nothing else is accepted, and nothing is unpickled.
- answer: :data:`MAGIC`, a ``u8`` status. ``0``: a ``u64`` size, then that many payload bytes.
  ``1``: refused; a ``u16`` length ``n`` (at most :data:`MAX_REFUSAL_BYTES`), then ``n`` bytes of a
  JSON object ``{"reason": str, "message": str}``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from lensemble.config import LensembleConfig
from lensemble.errors import PayloadError, UsageError
from lensemble.federation.messages import Reason
from lensemble.machinery.fresh_bytes import BytesBuilder
from lensemble.network.shared import transport_errors as nerr
from lensemble.network.shared.identity import COORDINATOR_IDENTITY, identity_path
from lensemble.network.shared.peer_text import shown
from lensemble.network.shared.security import Authenticator, load_tls
from lensemble.network.shared.streams import chunk_count, chunks

_log = logging.getLogger("lensemble.network.model_download")

#: First bytes of every request and answer (protocol version 1).
MAGIC = b"LNSDL/1\n"
#: Largest request body (bytes): an id, a session, a model hash and a token, with room to spare.
MAX_REQUEST_BYTES = 4096
#: Largest refusal body (bytes).
MAX_REFUSAL_BYTES = 1024
#: Bounds of the request's fields (characters), as for Join and Abstain (``peer_text``).
FIELD_LIMITS: dict[str, int] = {
    "participant_id": 64,
    "session": 64,
    "model_hash": 128,
    "token": 1024,
}
_REQUIRED = ("participant_id", "session", "model_hash")
#: Receive at most this much per read (bytes); TLS hands out one record per read anyway.
_READ_BYTES = 4 << 20
#: Bytes received between two updates of the participant's byte counter.
_COUNT_BYTES = 1 << 20
#: Connections one participant may hold open (a persistent one, and one to replace it).
CONNECTIONS_PER_PARTICIPANT = 2
#: The metric label of refusals here (``refused_calls_total{rpc}``).
RPC_LABEL = "ModelDownload"
BAD_REQUEST = "bad_request"

_LEN32 = struct.Struct(">I")
_LEN16 = struct.Struct(">H")
_SIZE = struct.Struct(">Q")


class _Closed(Exception):
    """The connection was closed before any answer byte (a kept connection gone idle)."""


class DownloadUnavailable(Exception):
    """The download port could not serve this download; FetchModel over gRPC should.

    Raised for a connection, handshake or timeout failure, a stream cut short, and a refusal
    (gRPC's FetchModel then gives the authoritative answer). ``reachable`` is False when the
    port could not be reached at all.
    """

    def __init__(self, message: str, *, reachable: bool = True) -> None:
        super().__init__(message)
        self.reachable = reachable


@dataclass(frozen=True)
class DownloadRequest:
    """A parsed request (see the module docstring)."""

    participant_id: str
    session: str
    model_hash: str
    token: str | None = None


def encode_request(request: DownloadRequest) -> bytes:
    """The request's bytes on the wire (magic, length, JSON)."""
    fields = {
        "participant_id": request.participant_id,
        "session": request.session,
        "model_hash": request.model_hash,
    }
    if request.token is not None:
        fields["token"] = request.token
    body = json.dumps(fields, separators=(",", ":")).encode()
    return MAGIC + _LEN32.pack(len(body)) + body


def parse_request(body: bytes) -> DownloadRequest | str:
    """The request in ``body`` (at most :data:`MAX_REQUEST_BYTES`), or why it is malformed.

    Never raises: any bytes give a request or one sentence naming what is wrong.
    """
    try:
        fields = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return "the request is not a UTF-8 JSON object."
    if not isinstance(fields, dict):
        return "the request is not a JSON object."
    unknown = sorted(set(fields) - set(FIELD_LIMITS))
    if unknown:
        return f"the request has unknown fields {shown(unknown)}."
    for name in _REQUIRED:
        if name not in fields:
            return f"the request has no {name}."
    for name, value in fields.items():
        if not isinstance(value, str):
            return f"the request's {name} is not a string."
        if len(value) > FIELD_LIMITS[name]:
            return f"the request's {name} is longer than {FIELD_LIMITS[name]} characters."
    return DownloadRequest(
        fields["participant_id"], fields["session"], fields["model_hash"], fields.get("token")
    )


def _refusal_bytes(reason: str, message: str) -> bytes:
    body = json.dumps({"reason": reason, "message": message}).encode()[:MAX_REFUSAL_BYTES]
    return MAGIC + b"\x01" + _LEN16.pack(len(body)) + body


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


def _recv_exact(sock: socket.socket, size: int, deadline: float) -> bytes:
    """``size`` bytes, within ``deadline`` (``time.monotonic()``); raises OSError otherwise."""
    parts, got = [], 0
    while got < size:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the peer did not send in time")
        sock.settimeout(remaining)
        part = sock.recv(size - got)
        if not part:
            raise ConnectionError(f"the peer closed after {got} of {size} bytes")
        parts.append(part)
        got += len(part)
    return b"".join(parts)


# ------------------------------------------------------------------------------ coordinator
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
        timeout_s: Bound of the handshake plus the first request, of every later request once
            its first byte arrived, and of every chunk written (seconds).
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
        timeout_s: float,
        idle_s: float,
        chunk_bytes: int,
    ) -> None:
        self.transport = transport
        self.auth = authenticator
        self.context = context
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
                conn, _address = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stopping.is_set():
                    return
                continue
            if not self._slots.acquire(blocking=False):
                self._refuse(nerr.BUSY)
                conn.close()
                continue
            threading.Thread(
                target=self._serve, args=(conn,), name="download-conn", daemon=True
            ).start()

    def _track(self, sock: socket.socket, add: bool) -> None:
        with self._lock:
            (self._open.add if add else self._open.discard)(sock)

    def _serve(self, conn: socket.socket) -> None:
        stream = conn
        self._track(conn, True)
        holder: str | None = None  # the participant this connection serves, once it asked
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            deadline = time.monotonic() + self.timeout_s
            conn.settimeout(self.timeout_s)
            if self.context is not None:
                try:
                    stream = self.context.wrap_socket(conn, server_side=True)
                except TimeoutError:
                    raise
                except (ssl.SSLError, OSError):
                    self._refuse(nerr.BAD_CREDENTIALS)  # no, or an unverifiable, certificate
                    return
                self._track(conn, False)
                self._track(stream, True)
            while not self._stopping.is_set():
                try:
                    request = self._request(stream, deadline)
                except (TimeoutError, ConnectionError):
                    if holder is None:
                        raise
                    return  # idle past max_connection_idle_s, or closed: the peer reconnects
                if isinstance(request, tuple):
                    refusal: tuple[str, str] | None = request
                elif holder is None:  # the first request: count the connection against its id
                    refusal = self._hold(request.participant_id)
                    holder = request.participant_id if refusal is None else None
                elif request.participant_id != holder:
                    refusal = (BAD_REQUEST, "one connection downloads for one participant.")
                else:
                    refusal = None
                if refusal is not None:
                    self._refuse(refusal[0])
                    stream.sendall(_refusal_bytes(*refusal))
                    return  # a refused connection is closed; the peer may dial again
                assert isinstance(request, DownloadRequest)
                if not self._send(stream, request):
                    return
                # The next request may come a round later: within max_connection_idle_s.
                deadline = time.monotonic() + self.idle_s
        except TimeoutError:
            self._refuse(nerr.CALL_DEADLINE)
        except OSError as exc:  # the peer went away, or stop() cut the download
            _log.debug("a model download connection ended early: %s", exc)
        finally:
            if holder is not None:
                with self._lock:
                    self._held[holder] -= 1
            self._track(stream, False)
            self._track(conn, False)
            stream.close()
            self._slots.release()

    def _request(self, stream: socket.socket, deadline: float) -> DownloadRequest | tuple[str, str]:
        """The next request, or ``(reason, message)`` refusing it (checked as FetchModel's)."""
        head = _recv_exact(stream, len(MAGIC) + _LEN32.size, deadline)
        (size,) = _LEN32.unpack_from(head, len(MAGIC))
        if head[: len(MAGIC)] != MAGIC or not 1 <= size <= MAX_REQUEST_BYTES:
            return BAD_REQUEST, "not a version-1 model download request."
        # The body follows the header at once: one RPC deadline, however long the idle wait.
        body = _recv_exact(stream, size, min(deadline, time.monotonic() + self.timeout_s))
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
            stream.sendall(_refusal_bytes(nerr.BUSY, "this participant is already downloading."))
            return False
        try:
            payload = self.transport.model_payload(request.model_hash)
            if payload is None:
                reason = Reason.CLOSED_ROUND.value
                self._refuse(reason)
                message = f"model {request.model_hash[:19]}... is not the open round's model."
                stream.sendall(_refusal_bytes(reason, message))
                return False
            stream.settimeout(self.timeout_s)  # per chunk: a slow link takes many
            stream.sendall(MAGIC + b"\x00" + _SIZE.pack(len(payload)))
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
    transport: Any, authenticator: Authenticator, config: LensembleConfig, *, port: int | None
) -> ModelDownloadServer | None:
    """Serve the download port when ``port`` (``network.download_port``) is set, else None.

    At most two connections per participant of the run, plus four, are served at once.

    Raises:
        UsageError: The port cannot be bound.
        ConfigError: A TLS file is missing or unreadable.
    """
    if port is None:
        return None
    net = config.network
    server = ModelDownloadServer(
        transport,
        authenticator,
        server_context(config),
        host=net.listen_host,
        port=port,
        max_connections=2 * len(config.participant_ids) + 4,
        timeout_s=net.rpc_timeout_s,
        idle_s=net.max_connection_idle_s,
        chunk_bytes=net.chunk_bytes,
    )
    server.start()
    return server


# ------------------------------------------------------------------------------ participant
class ModelDownloader:
    """A participant's side of the download port.

    One connection is kept open between downloads, as gRPC keeps its channel: a TLS handshake
    took 3-7 ms here, 5-10% of a 40 MB download. When the coordinator closed it meanwhile
    (``network.max_connection_idle_s``, a restart), the download dials once more.
    Not thread-safe: one participant loop downloads at a time.

    Args:
        config: The run's config (``network.host``, ``download_port``, TLS and timeouts).
        participant_id: This participant.
        token: Its bearer token (``auth: token``), else None.
        count_in: Called with the size of every piece received (bytes), for the metrics.

    Raises:
        ConfigError: A TLS file is missing or unreadable.
    """

    def __init__(
        self,
        config: LensembleConfig,
        participant_id: str,
        token: str | None,
        count_in: Callable[[int], None],
    ) -> None:
        net = config.network
        assert net.download_port is not None
        self.host = net.host.strip("[]")
        self.port = net.download_port
        self.id = participant_id
        self.token = token
        self.timeout_s = net.rpc_timeout_s
        self.chunk_bytes = net.chunk_bytes
        self.count_in = count_in
        self.context: ssl.SSLContext | None = None
        self._stream: socket.socket | None = None  # kept open between downloads
        files = load_tls(config, participant_id)
        if files is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the name, as gRPC does
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_verify_locations(cadata=files.ca.decode("ascii", errors="replace"))
            if net.tls.client_auth:
                cert = identity_path(net.tls.cert_file, participant_id)
                key = identity_path(net.tls.key_file, participant_id)
                assert cert is not None and key is not None  # load_tls read both
                context.load_cert_chain(cert, key)
            self.context = context

    def fetch(self, session: str, model_hash: str, declared: int, limit: int) -> bytes:
        """The model payload of ``model_hash``, read into one ``bytes`` object.

        Args:
            session: The coordinator session of this participant's Join.
            model_hash: The announced model hash.
            declared: The announced payload size (bytes).
            limit: The largest model payload accepted (bytes).

        Raises:
            DownloadUnavailable: The port is unreachable, the handshake failed, the coordinator
                refused, or the stream broke or stalled: download over FetchModel instead.
            PayloadError: The coordinator broke the protocol (a bad answer, a size other than
                announced or above ``limit``): it is broken or hostile.
        """
        request = encode_request(DownloadRequest(self.id, session, model_hash, self.token))
        reused = self._stream is not None
        try:
            return self._fetch_once(request, declared, limit)
        except _Closed:
            self.close()
            if not reused:
                raise DownloadUnavailable("the coordinator closed the connection") from None
        # The coordinator closed the connection while it was idle: once more, on a new one.
        try:
            return self._fetch_once(request, declared, limit)
        except _Closed:
            self.close()
            raise DownloadUnavailable("the coordinator closed the connection") from None

    def _fetch_once(self, request: bytes, declared: int, limit: int) -> bytes:
        if self._stream is None:
            self._stream = self._connect()
        try:
            try:
                self._stream.sendall(request)
                head = _recv_exact(self._stream, len(MAGIC) + 1, time.monotonic() + self.timeout_s)
            except (ConnectionError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
                raise _Closed from None  # before any answer byte: nothing was downloaded
            return self._read(self._stream, head, declared, limit)
        except (DownloadUnavailable, PayloadError):
            self.close()  # the coordinator closes a refused connection too
            raise
        except (ssl.SSLError, OSError) as exc:
            self.close()
            raise DownloadUnavailable(f"the download broke off ({exc})") from None

    def _connect(self) -> socket.socket:
        try:
            raw = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        except OSError as exc:
            raise DownloadUnavailable(
                f"cannot connect to {self.host}:{self.port} ({exc})", reachable=False
            ) from None
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.context is None:
                return raw
            return self.context.wrap_socket(raw, server_hostname=self.host)
        except (ssl.SSLError, OSError) as exc:
            raw.close()
            raise DownloadUnavailable(f"the TLS handshake failed ({exc})") from None

    def close(self) -> None:
        """Close the connection kept open between downloads (the next download dials anew)."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def _read(self, stream: socket.socket, head: bytes, declared: int, limit: int) -> bytes:
        # The whole download may take one rpc_timeout_s per chunk, as FetchModel's deadline.
        deadline = time.monotonic() + self.timeout_s * (chunk_count(declared, self.chunk_bytes) + 1)
        if head[: len(MAGIC)] != MAGIC or head[-1] not in (0, 1):
            raise PayloadError(
                "the coordinator's model download port answered in an unknown format;",
                remediation="it is not a Lensemble coordinator of this version, or it is "
                "hostile; the download was refused.",
            )
        if head[-1] == 1:
            (size,) = _LEN16.unpack(_recv_exact(stream, _LEN16.size, deadline))
            body = _recv_exact(stream, min(size, MAX_REFUSAL_BYTES), deadline)
            said = shown(body.decode(errors="replace"))
            raise DownloadUnavailable(f"the coordinator refused: {said}")
        (size,) = _SIZE.unpack(_recv_exact(stream, _SIZE.size, deadline))
        if size != declared or size > limit:
            raise PayloadError(
                f"the coordinator's model download declares {size} bytes, but the round "
                f"announced {declared} (cap {limit});",
                remediation="the coordinator is broken or hostile; the download was refused.",
            )
        builder = BytesBuilder(size, recycle=True)
        view = builder.tail()
        got = counted = 0
        # One timeout for every read (TLS hands out a 16 KiB record per read: setting it per
        # read cost a syscall each), and the whole download's deadline checked between reads.
        stream.settimeout(self.timeout_s)
        try:
            while got < size:
                if time.monotonic() > deadline:
                    raise TimeoutError("the model download stalled")
                n = stream.recv_into(view[got:], min(_READ_BYTES, size - got))
                if n == 0:
                    raise ConnectionError(f"the coordinator closed after {got} of {size} bytes")
                got += n
                if got - counted >= _COUNT_BYTES:  # the metric's lock, once per MiB
                    self.count_in(got - counted)
                    counted = got
        finally:
            self.count_in(got - counted)
        builder.advance(got)
        del view
        return builder.finish()
