"""A participant's client of the coordinator's model download port.

The wire format is :mod:`lensemble.network.shared.download_protocol`'s. Whatever goes wrong
short of a protocol violation (the port unreachable, a failed handshake, a refusal, a stream
cut short or stalled) raises :class:`DownloadUnavailable`, and the participant fetches the model
over gRPC FetchModel instead, which gives the authoritative answer.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable

from lensemble.config import LensembleConfig
from lensemble.errors import PayloadError
from lensemble.machinery.fresh_bytes import BytesBuilder
from lensemble.network.shared.download_protocol import (
    LEN16,
    MAGIC,
    MAX_REFUSAL_BYTES,
    SIZE,
    STATUS_PAYLOAD,
    STATUS_REFUSED,
    DownloadRequest,
    encode_request,
    recv_exact,
)
from lensemble.network.shared.identity import identity_path
from lensemble.network.shared.peer_text import shown
from lensemble.network.shared.security import load_tls
from lensemble.network.shared.streams import chunk_count

#: Receive at most this much per read (bytes); TLS hands out one record per read anyway.
_READ_BYTES = 4 << 20
#: Bytes received between two updates of the participant's byte counter.
_COUNT_BYTES = 1 << 20


class _Closed(Exception):
    """The connection was closed before any answer byte (a kept connection gone idle)."""


class DownloadUnavailable(Exception):
    """The download port could not serve this download; FetchModel over gRPC should.

    Raised for a connection, handshake or timeout failure, a stream cut short, and a refusal
    (gRPC's FetchModel then gives the authoritative answer). ``reachable`` is False when the
    port could not be reached at all; ``refused`` is True when the coordinator answered with a
    refusal of this one download (the port itself works).
    """

    def __init__(self, message: str, *, reachable: bool = True, refused: bool = False) -> None:
        super().__init__(message)
        self.reachable = reachable
        self.refused = refused


class ModelDownloader:
    """A participant's side of the download port.

    One connection is kept open between downloads, as gRPC keeps its channel: a TLS handshake
    costs a noticeable share of a download (``docs/performance.md``, *The model download
    port*). When the coordinator closed it meanwhile (``network.max_connection_idle_s``, a
    restart), the download dials once more.
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
                head = recv_exact(self._stream, len(MAGIC) + 1, time.monotonic() + self.timeout_s)
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
        if head[: len(MAGIC)] != MAGIC or head[-1] not in (STATUS_PAYLOAD, STATUS_REFUSED):
            raise PayloadError(
                "the coordinator's model download port answered in an unknown format;",
                remediation="it is not a Lensemble coordinator of this version, or it is "
                "hostile; the download was refused.",
            )
        if head[-1] == STATUS_REFUSED:
            (size,) = LEN16.unpack(recv_exact(stream, LEN16.size, deadline))
            body = recv_exact(stream, min(size, MAX_REFUSAL_BYTES), deadline)
            said = shown(body.decode(errors="replace"))
            raise DownloadUnavailable(f"the coordinator refused: {said}", refused=True)
        (size,) = SIZE.unpack(recv_exact(stream, SIZE.size, deadline))
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
