"""Chunked payload streams with a hard size limit enforced before anything is buffered.

Payloads (safetensors bytes) travel as a sequence of chunks of ``network.chunk_bytes``. The
receiver knows the declared total from the first chunk and refuses at once when it exceeds its
cap (:mod:`lensemble.network.shared.payload_limits`); it then refuses as soon as the bytes
received exceed the declared total, so it never holds more than ``min(declared, limit)`` bytes
of one stream.

Outgoing chunk messages are framed here (:func:`with_bytes_field`) rather than by protobuf's
serializer, which copies a large ``bytes`` field at well under memory speed
(``docs/performance.md``, *Chunk frames built without protobuf's copies*): the frames are
byte-identical to ``SerializeToString`` of the same message. An incoming update chunk is split here
(:func:`split_bytes_field`): its data field is taken as a view of the received frame, and only
the rest (the header, a few hundred bytes) is parsed by protobuf, which would copy the data
once more.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

from lensemble.errors import PayloadError
from lensemble.federation.intake import Landing
from lensemble.machinery.fresh_bytes import LARGE, BytesBuilder

#: Makes the file a stream of the given size lands in, or None for memory
#: (:meth:`lensemble.federation.intake.Intake.land`).
Lander = Callable[[int], Landing | None]

#: Headroom (bytes) above ``chunk_bytes`` for protobuf framing and headers in one gRPC message.
FRAME_OVERHEAD = 64 * 1024
#: Smallest per-message receive limit (bytes): Join carries the config view as JSON.
MIN_MESSAGE_LIMIT = 4 * 1024 * 1024


class TooLarge(PayloadError):
    """A stream declared more bytes than its cap (the model's wire size or a lower config)."""

    code = "payload_too_large"


def grpc_message_limit(chunk_bytes: int) -> int:
    """Largest single gRPC message (bytes) a process accepts: one chunk plus framing."""
    return max(chunk_bytes, MIN_MESSAGE_LIMIT) + FRAME_OVERHEAD


#: Protobuf wire type of a length-delimited field (``bytes``, ``string``, messages).
_LENGTH_DELIMITED = 2


def _varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def with_bytes_field(prefix: bytes, field_number: int, data: bytes | memoryview) -> bytes:
    """A serialized message: ``prefix`` (its other fields) followed by one ``bytes`` field.

    Equal to ``SerializeToString()`` of the message whose other fields serialize to ``prefix``
    and whose field ``field_number`` holds ``data``, provided that field is the message's last
    (protobuf writes fields in number order and skips an empty ``bytes`` field), with one copy
    of ``data`` instead of protobuf's several.

    Args:
        prefix: The message without the field, serialized by protobuf.
        field_number: Number of the ``bytes`` field (the highest of the message).
        data: The field's value (a view is not copied until the frame is built).

    Returns:
        The frame, ready for a gRPC call whose serializer passes bytes through.
    """
    if not len(data):
        return prefix
    tag = _varint(field_number << 3 | _LENGTH_DELIMITED)
    return b"".join((prefix, tag, _varint(len(data)), data))


#: Protobuf wire types (https://protobuf.dev/programming-guides/encoding/#structure).
_VARINT, _FIXED64, _FIXED32 = 0, 1, 5
#: Longest varint protobuf writes (a 64-bit value in 7-bit groups).
_MAX_VARINT_BYTES = 10
#: Most top-level fields a received chunk frame may hold. Ours hold at most two (header and
#: data); the bound keeps a frame of a million one-byte fields from holding the GIL for seconds
#: in the walk below.
MAX_FRAME_FIELDS = 16


class FrameError(PayloadError):
    """A received frame is not a well-formed protobuf message of the expected shape."""

    code = "bad_payload"


def _read_varint(frame: memoryview, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it.

    Raises:
        FrameError: The frame ends inside it, or it is longer than 10 bytes.
    """
    value = shift = 0
    for i in range(pos, min(pos + _MAX_VARINT_BYTES, len(frame))):
        byte = frame[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i + 1
        shift += 7
    raise FrameError("a chunk frame holds a truncated or overlong varint.")


def split_bytes_field(
    frame: bytes, field_number: int, *, max_fields: int = MAX_FRAME_FIELDS
) -> tuple[bytes, memoryview]:
    """Split a serialized message into its ``bytes`` field ``field_number`` and everything else.

    Walks the top-level fields of ``frame`` by the protobuf wire format (varint, fixed64,
    length-delimited and fixed32 fields; groups are refused), bounds-checking every length
    against the frame, so a hostile frame can neither read past its end nor loop. The field's
    value is returned as a view of ``frame`` (no copy); the other fields, in order, as bytes for
    protobuf to parse (``Message.FromString`` of them equals the message without that field).

    Args:
        frame: The received message (gRPC hands it over as ``bytes``).
        field_number: The ``bytes`` field to take out (e.g. ``UpdateChunk.data``, 2).
        max_fields: Most top-level fields the frame may hold (unknown ones included).

    Returns:
        ``(the other fields' bytes, the field's value)``; the value is empty when absent.

    Raises:
        FrameError: The frame is malformed, holds more than ``max_fields`` fields, or carries
            the field more than once (protobuf's own serializer never does).
    """
    view = memoryview(frame).cast("B")
    size = len(view)
    rest: list[memoryview] = []
    data: memoryview | None = None
    pos = fields = 0
    while pos < size:
        fields += 1
        if fields > max_fields:
            raise FrameError(f"a chunk frame holds more than {max_fields} fields.")
        start = pos
        tag, pos = _read_varint(view, pos)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise FrameError("a chunk frame has a field numbered 0.")
        if wire == _VARINT:
            _, pos = _read_varint(view, pos)
        elif wire == _FIXED64:
            pos += 8
        elif wire == _FIXED32:
            pos += 4
        elif wire == _LENGTH_DELIMITED:
            length, pos = _read_varint(view, pos)
            if length > size - pos:
                raise FrameError("a chunk frame declares a field longer than the frame.")
            if number == field_number:
                if data is not None:
                    raise FrameError(f"a chunk frame carries field {field_number} twice.")
                data = view[pos : pos + length]
                pos += length
                continue
            pos += length
        else:
            raise FrameError(f"a chunk frame uses protobuf wire type {wire} (groups are refused).")
        if pos > size:
            raise FrameError("a chunk frame ends inside a field.")
        rest.append(view[start:pos])
    other = rest[0].tobytes() if len(rest) == 1 else b"".join(rest)
    return other, data if data is not None else view[0:0]


def chunks(data: bytes, chunk_bytes: int) -> Iterator[memoryview]:
    """Split ``data`` into consecutive views of at most ``chunk_bytes`` bytes (at least one).

    Args:
        data: The payload.
        chunk_bytes: Chunk size in bytes (``network.chunk_bytes``), positive.

    Yields:
        Zero-copy views into ``data``; an empty payload yields one empty view.
    """
    view = memoryview(data)
    if not view:
        yield view
        return
    for start in range(0, len(view), chunk_bytes):
        yield view[start : start + chunk_bytes]


def chunk_count(size: int, chunk_bytes: int) -> int:
    """Number of chunks :func:`chunks` yields for a payload of ``size`` bytes."""
    return max(1, -(-size // chunk_bytes))


class Assembler:
    """Collects one stream's chunks into the payload, refusing oversize streams early.

    The payload is written into one ``bytes`` object of the declared size, allocated up front
    without being zero-filled (:class:`~lensemble.machinery.fresh_bytes.BytesBuilder`; the
    zero fill was a large share of a SubmitUpdate stream's time, ``docs/performance.md``,
    *Huge pages*) and handed out without a copy, and hashed chunk by chunk as it arrives: a
    stream of ``n`` bytes costs ``n`` bytes of memory (plus the chunk in flight), never two
    copies.

    The object is the process's recycled one when nothing holds it any more (``recycle=True``,
    the one slot the encoder of outgoing payloads also uses): a fresh object had the kernel
    fault in and zero every page of it as the chunks were copied in (``docs/performance.md``,
    *Received payloads written over the last one*). A stream that fails leaves the slot empty;
    it never hands out a half-written object.

    With ``land`` (the coordinator's update streams), a stream of at least
    :data:`~lensemble.machinery.fresh_bytes.LARGE` bytes is written into a spool file instead
    (:class:`~lensemble.federation.intake.Landing`): chunk by chunk, nothing of it kept in
    memory, so N uploads at once do not hold N payloads. :meth:`finish` then returns a
    read-only view of that file, and :attr:`landing` the file.

    Args:
        declared: Total bytes announced by the sender.
        limit: The stream's cap (see :mod:`lensemble.network.shared.payload_limits`).
        what: Names the payload in error messages, e.g. ``"the update from alpine"``.
        hashed: Hash the bytes while they arrive (:attr:`payload_hash`); False where nobody
            reads that hash (a model download is verified by its model hash after decoding).
        land: Gives the spool file to land the stream in (called once the size passed its
            cap), or returns None for memory.

    Raises:
        TooLarge: ``declared`` exceeds ``limit`` (raised by the constructor, before any
            buffering).
    """

    def __init__(
        self,
        declared: int,
        limit: int,
        what: str,
        *,
        hashed: bool = True,
        land: Lander | None = None,
    ) -> None:
        if declared > limit:
            raise TooLarge(
                f"{what} declares {declared} bytes, above the {limit}-byte cap of this run "
                "(derived from the model's wire size, or network.max_message_bytes);",
                remediation="the sender runs another model or config, or is hostile; the stream "
                "was refused before any byte was buffered.",
            )
        self.declared = declared
        self.what = what
        self._received = 0
        self._hash = hashlib.sha256() if hashed else None
        self.landing = land(declared) if land is not None and declared >= LARGE else None
        self._buffer = BytesBuilder(declared, recycle=True) if self.landing is None else None

    @property
    def received(self) -> int:
        """Bytes received so far."""
        return self._received

    def add(self, data: bytes | memoryview) -> None:
        """Append one chunk.

        Raises:
            PayloadError: The chunk would take the stream past its declared size (nothing of it
                is kept).
            OSError: The spool file could not be written (only with a landing).
        """
        if self._received + len(data) > self.declared:
            raise PayloadError(
                f"{self.what} sent more than the {self.declared} bytes it declared;",
                remediation="the sender is broken or hostile; the stream was refused.",
            )
        if self.landing is not None:
            self.landing.write(data)  # fits: checked above
        else:
            assert self._buffer is not None
            self._buffer.write(data)
        if self._hash is not None:
            self._hash.update(data)
        self._received += len(data)

    @property
    def payload_hash(self) -> str:
        """``"sha256:<hex>"`` of the bytes received so far (the whole payload once finished).

        Raises:
            RuntimeError: The assembler was made with ``hashed=False`` (our bug).
        """
        if self._hash is None:
            raise RuntimeError(f"{self.what} was assembled without hashing.")
        return "sha256:" + self._hash.hexdigest()

    def finish(self) -> bytes | memoryview:
        """The complete payload: the buffer itself, or a read-only view of its spool file.

        Neither is a copy.

        Raises:
            PayloadError: The stream ended before the declared size (truncated).
            OSError: The spool file could not be mapped (only with a landing).
        """
        if self._received != self.declared:
            raise PayloadError(
                f"{self.what} is truncated: {self._received} of {self.declared} declared "
                "bytes arrived;",
                remediation="the connection broke or the sender is broken; it may resend.",
            )
        if self.landing is not None:
            return self.landing.finish()
        assert self._buffer is not None
        return self._buffer.finish()


def first_message(call: Any) -> Any:
    """The first message of a server stream, or None when it ends empty; the call is cancelled.

    Args:
        call: A gRPC response iterator (``grpc.Call`` and iterable), e.g. of ``WatchRounds``.

    Raises:
        grpc.RpcError: The call failed before its first message.
    """
    try:
        for message in call:
            return message
    finally:
        call.cancel()
    return None
