"""A participant's calls to the coordinator, each with a deadline.

:class:`CoordinatorClient` makes the calls of ``lensemble.v1.Coordinator`` over one gRPC channel
(TLS per ``network.tls``, the bearer token with ``auth: token``); every call names its
participant in the ``lensemble-participant`` metadata, so the coordinator authenticates it before
reading any request. The model of a round comes over the download port when the config has one
(:mod:`lensemble.network.participant.download_client`), else over FetchModel; an update streams
as framed chunks (:mod:`lensemble.network.shared.frames`). What a failed call means is
:mod:`lensemble.network.participant.call_errors`'s.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import grpc

from lensemble import __version__
from lensemble.config import LensembleConfig, config_hash
from lensemble.config.hashing import canonical_json, hashed_view
from lensemble.errors import PayloadError
from lensemble.federation.messages import RoundOpening
from lensemble.federation.participant import Contribution
from lensemble.federation.payload import TensorSpec
from lensemble.network.participant.call_errors import classify
from lensemble.network.participant.download_client import DownloadUnavailable, ModelDownloader
from lensemble.network.shared.frames import (
    FETCH_METHOD,
    SUBMIT_METHOD,
    UPDATE_DATA_FIELD,
    parse_model_frame,
    passthrough,
)
from lensemble.network.shared.grpc_options import channel_options, presence_window_s
from lensemble.network.shared.identity import PARTICIPANT_KEY
from lensemble.network.shared.logs import event
from lensemble.network.shared.metrics import Metrics
from lensemble.network.shared.payload_limits import payload_limits
from lensemble.network.shared.proto import lensemble_pb2 as pb
from lensemble.network.shared.proto import lensemble_pb2_grpc as pb_grpc
from lensemble.network.shared.security import channel_credentials
from lensemble.network.shared.streams import (
    Assembler,
    chunk_count,
    chunks,
    first_message,
    with_bytes_field,
)

_log = logging.getLogger("lensemble.network.participant")
#: Downloads that go over FetchModel at once after the download port failed (unreachable, a
#: failed handshake, a stream broken off or stalled by a middlebox): the same failure every
#: round would cost a connection attempt, or a whole stall, per round.
_DOWNLOAD_PAUSE = 16


def coordinator_target(config: LensembleConfig) -> str:
    """``host:port`` of the coordinator (IPv6 literals bracketed)."""
    host = config.network.host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{config.network.port}"


class CoordinatorClient:
    """Typed calls to the coordinator, each with a deadline.

    Args:
        config: The run's config.
        participant_id: This participant.
        token: Bearer token (``auth: token``), else None.
        metrics: Where to count bytes in and out.
        architecture: The global model's parameters (name -> spec): caps a model download at
            its wire size (:mod:`lensemble.network.shared.payload_limits`). None: the cap is
            ``network.max_message_bytes``, else the size the coordinator announces.

    Attributes:
        session: The coordinator session of the last accepted Join ("" before).

    Raises:
        ConfigError: ``network.max_message_bytes`` is below the model's wire size.
    """

    def __init__(
        self,
        config: LensembleConfig,
        participant_id: str,
        *,
        token: str | None = None,
        metrics: Metrics | None = None,
        architecture: Mapping[str, TensorSpec] | None = None,
    ) -> None:
        self.config = config
        self.id = participant_id
        self.metrics = metrics or Metrics()
        self.target = coordinator_target(config)
        credentials = channel_credentials(config, participant_id, token)
        options = channel_options(config)
        self.channel = (
            grpc.secure_channel(self.target, credentials, options=options)
            if credentials is not None
            else grpc.insecure_channel(self.target, options=options)
        )
        self.stub = pb_grpc.CoordinatorStub(self.channel)  # type: ignore[no-untyped-call]
        # SubmitUpdate sends frames built by streams.with_bytes_field (serializer: as is).
        self._submit_update = self.channel.stream_unary(
            SUBMIT_METHOD,
            request_serializer=passthrough,
            response_deserializer=pb.SubmitReply.FromString,
        )
        # FetchModel's chunks are read with the data field as a view (parse_model_frame).
        self._fetch_model = self.channel.unary_stream(
            FETCH_METHOD,
            request_serializer=pb.FetchModelRequest.SerializeToString,
            response_deserializer=parse_model_frame,
        )
        self.session = ""
        net = config.network
        self.timeout_s = net.rpc_timeout_s
        self.chunk_bytes = net.chunk_bytes
        self.max_bytes: int | None = (
            payload_limits(config, architecture).model_bytes
            if architecture is not None
            else net.max_message_bytes
        )
        # The download port (network.download_port), tried before FetchModel; after it failed
        # (anything but a refusal of one download), the next _DOWNLOAD_PAUSE downloads go over
        # FetchModel at once.
        self._downloader = (
            ModelDownloader(config, participant_id, token, self.metrics.bytes_in.inc)
            if net.download_port is not None
            else None
        )
        self._download_pause = 0
        self._download_warned = False
        self._download_used = False  # logged once: models come over the download port
        # Every call names its participant, so the coordinator authenticates it before
        # reading any request (see lensemble.network.coordinator.call_guard).
        self.metadata = ((PARTICIPANT_KEY, participant_id),)
        self._presence_call: Any = None
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the channel (ending a held presence stream) and the download connection."""
        self.end_presence()
        if self._downloader is not None:
            self._downloader.close()
        self.channel.close()

    def join(self) -> pb.JoinReply:
        """Join the run (the session is kept when accepted)."""
        reply: pb.JoinReply = self.stub.Join(
            pb.JoinRequest(
                participant_id=self.id,
                config_hash=config_hash(self.config),
                config_view_json=canonical_json(hashed_view(self.config)).decode(),
                software_version=__version__,
            ),
            timeout=self.timeout_s,
            metadata=self.metadata,
        )
        if reply.accepted:
            self.session = reply.session
        return reply

    def watch(self, after: tuple[int, int]) -> pb.RoundAnnouncement | None:
        """The next opening newer than ``after``, or None when the watch window ended."""
        call = self.stub.WatchRounds(
            pb.WatchRoundsRequest(
                participant_id=self.id,
                session=self.session,
                after_round=after[0],
                after_attempt=after[1],
            ),
            timeout=self.timeout_s,
            metadata=self.metadata,
        )
        return first_message(call)  # type: ignore[no-any-return]

    def fetch(self, announcement: pb.RoundAnnouncement) -> bytes:
        """Download the round's model payload.

        Over the download port when the config has one and it serves
        (:mod:`lensemble.network.participant.download_client`), else over gRPC FetchModel.

        Raises:
            PayloadError: The coordinator announced a model above ``max_message_bytes``, sent
                more or fewer bytes than it declared, or sent a malformed chunk.
            grpc.RpcError: The call failed.
        """
        limit = announcement.model_bytes if self.max_bytes is None else self.max_bytes
        downloaded = self._download(announcement, limit)
        if downloaded is not None:
            return downloaded
        deadline = self.timeout_s * chunk_count(announcement.model_bytes, self.chunk_bytes)
        call = self._fetch_model(
            pb.FetchModelRequest(
                participant_id=self.id, session=self.session, model_hash=announcement.model_hash
            ),
            timeout=deadline,
            metadata=self.metadata,
        )
        what = f"the model of round {announcement.round_index}"
        assembler: Assembler | None = None
        try:
            for frame in call:
                if frame.error is not None:
                    raise PayloadError(
                        f"{what} arrived in a malformed chunk: {frame.error}",
                        remediation="the coordinator is broken or hostile; the download was "
                        "refused.",
                    )
                if assembler is None:
                    # Not hashed: the decoded model is checked against its model hash.
                    assembler = Assembler(frame.total_bytes, limit, what, hashed=False)
                assembler.add(frame.data)  # a view of the received frame: its only copy
                self.metrics.bytes_in.inc(len(frame.data))
        finally:
            call.cancel()
        if assembler is None:
            raise PayloadError("the coordinator sent no model bytes.")
        payload = assembler.finish()
        assert isinstance(payload, bytes)  # assembled in memory: only updates land on disk
        return payload

    @property
    def download_port(self) -> int | None:
        """The coordinator's model download port this participant fetches from (None: gRPC)."""
        return self._downloader.port if self._downloader is not None else None

    def _download(self, announcement: pb.RoundAnnouncement, limit: int) -> bytes | None:
        """The model over the download port, or None to fetch it over gRPC.

        Raises:
            PayloadError: The coordinator broke the download's protocol.
        """
        if self._downloader is None:
            return None
        if self._download_pause > 0:
            self._download_pause -= 1
            return None
        where = f"{self._downloader.host}:{self._downloader.port}"
        try:
            payload = self._downloader.fetch(
                self.session, announcement.model_hash, announcement.model_bytes, limit
            )
        except DownloadUnavailable as exc:
            if exc.refused:  # this download only; the port works: FetchModel says why
                _log.info(
                    "the download port %s refused round %d's model (%s); fetching it over gRPC "
                    "FetchModel.",
                    where,
                    announcement.round_index,
                    exc,
                )
                return None
            self._download_pause = _DOWNLOAD_PAUSE
            # At warning level the first time and after a success: a port that keeps failing
            # would otherwise log every _DOWNLOAD_PAUSE rounds.
            level = logging.DEBUG if self._download_warned else logging.WARNING
            self._download_warned = True
            _log.log(
                level,
                "the model download port %s did not serve the model of round %d (%s); "
                "fetching it and the next %d models over gRPC FetchModel, which is slower. "
                "Open network.download_port between participant and coordinator (behind a "
                "front door that forwards one port, set it to null).",
                where,
                announcement.round_index,
                exc,
                _DOWNLOAD_PAUSE,
            )
            return None
        if not self._download_used or self._download_warned:
            event(
                _log,
                "download_used",
                f"round {announcement.round_index}'s model came over the download port {where}.",
                download_port=self._downloader.port,
            )
            self._download_used, self._download_warned = True, False
        return payload

    def submit(
        self,
        opening: RoundOpening,
        contribution: Contribution,
        before_last: Callable[[], None] | None = None,
    ) -> pb.SubmitReply:
        """Stream a sealed pseudo-gradient and return the coordinator's verdict.

        Args:
            opening: The round the update is for.
            contribution: The sealed update.
            before_last: Called before the last chunk is sent (the participant's inner-state
                snapshot is settled there, so it is durable before the update can count).

        Raises:
            grpc.RpcError: The call failed.
            Exception: Whatever ``before_last`` raised; the stream then ended short, so the
                coordinator refused the update.
        """
        payload = contribution.payload
        header = pb.UpdateHeader(
            participant_id=self.id,
            session=self.session,
            round_index=opening.round_index,
            attempt=opening.attempt,
            payload_hash=contribution.payload_hash,
            quantization=self.config.federation.quantization,
            total_bytes=len(payload),
            compute_s=contribution.compute_s,
        )

        failed: list[Exception] = []
        count = chunk_count(len(payload), self.chunk_bytes)

        def stream() -> Iterator[bytes]:
            # Serialized UpdateChunk frames: the header, then one copy of each chunk.
            prefix = pb.UpdateChunk(header=header).SerializeToString()
            for index, view in enumerate(chunks(payload, self.chunk_bytes)):
                if index == count - 1 and before_last is not None:
                    try:
                        before_last()
                    except Exception as exc:  # raised below, once the call has ended
                        failed.append(exc)
                        return
                self.metrics.bytes_out.inc(len(view))
                yield with_bytes_field(prefix, UPDATE_DATA_FIELD, view)
                prefix = b""

        deadline = self.timeout_s * (count + 1)
        try:
            reply: pb.SubmitReply = self._submit_update(
                stream(), timeout=deadline, metadata=self.metadata
            )
        except grpc.RpcError:
            if failed:
                raise failed[0] from None
            raise
        if failed:
            raise failed[0]
        return reply

    def abstain(self, opening: RoundOpening, reason: str) -> pb.AbstainReply:
        """Tell the coordinator this participant sits out ``opening``'s attempt, for ``reason``.

        Args:
            opening: The attempt sat out.
            reason: One of ``lensemble.federation.messages.ABSTENTION_REASONS``.

        Raises:
            grpc.RpcError: The call failed (``UNIMPLEMENTED`` from a coordinator that predates
                ``Abstain``).
        """
        reply: pb.AbstainReply = self.stub.Abstain(
            pb.AbstainRequest(
                participant_id=self.id,
                session=self.session,
                round_index=opening.round_index,
                attempt=opening.attempt,
                reason=reason,
            ),
            timeout=self.timeout_s,
            metadata=self.metadata,
        )
        return reply

    def leave(self, reason: str) -> None:
        """Tell the coordinator this participant stops (best effort, one short call)."""
        try:
            self.stub.Leave(
                pb.LeaveRequest(participant_id=self.id, session=self.session, reason=reason),
                timeout=min(self.timeout_s, 5.0),
                metadata=self.metadata,
            )
        except grpc.RpcError as exc:
            _log.info("could not say goodbye to the coordinator (%s).", classify(exc))

    def hold_presence(self, stop: threading.Event) -> None:
        """Keep a Presence stream open until ``stop`` is set (run it in its own thread).

        Each stream lasts one window; the next opens at once. A failed stream is retried
        after a short pause (the main loop handles rejoining and giving up). The first beat
        of a stream after a failed one logs ``present``: the coordinator counts this
        participant present again from that beat on (its handler counts before the beat).
        """
        window = presence_window_s(self.config)
        failed = False
        while not stop.is_set():
            call = self.stub.Presence(
                pb.PresenceRequest(participant_id=self.id, session=self.session),
                timeout=window + 2 * self.timeout_s,
                metadata=self.metadata,
            )
            with self._lock:
                self._presence_call = call
            if stop.is_set():
                call.cancel()
                return
            try:
                for _beat in call:
                    if failed:
                        failed = False
                        event(_log, "present", "the coordinator counts this participant again.")
                    if stop.is_set():
                        break
            except grpc.RpcError as exc:
                error = classify(exc)
                if error.reason != "cancelled":
                    failed = True
                    _log.debug("presence stream ended (%s); opening another.", error)
                stop.wait(min(1.0, self.timeout_s))
            finally:
                call.cancel()

    def end_presence(self) -> None:
        """Cancel the presence stream held by :meth:`hold_presence` (if any)."""
        with self._lock:
            call, self._presence_call = self._presence_call, None
        if call is not None:
            call.cancel()
