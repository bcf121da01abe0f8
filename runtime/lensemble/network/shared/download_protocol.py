"""The model download's wire format: each round's model over a TLS socket of its own.

Why a second port beside gRPC: grpcio streams a payload through HTTP/2 frames, its own slices
and a handoff to a Python thread per message, well below what a raw TLS socket moves between
the same two processes (``docs/performance.md``, *The model download port*). Here the
coordinator writes views of the round's cached payload straight into a TLS socket
(:mod:`lensemble.network.coordinator.download_server`), and the participant reads them straight
into the ``bytes`` object it hands on (:mod:`lensemble.network.participant.download_client`):
the raw socket's own path. gRPC still carries everything else, and a participant that cannot use
this port downloads over FetchModel.

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

import json
import socket
import struct
import time
from dataclasses import dataclass

from lensemble.network.shared.peer_text import shown

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
#: The refusal reason of a request that is not well-formed.
BAD_REQUEST = "bad_request"
#: The answer's status byte: the payload follows, or a refusal does.
STATUS_PAYLOAD = 0
STATUS_REFUSED = 1

LEN32 = struct.Struct(">I")
LEN16 = struct.Struct(">H")
SIZE = struct.Struct(">Q")


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
    return MAGIC + LEN32.pack(len(body)) + body


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


def encode_refusal(reason: str, message: str) -> bytes:
    """A refusal answer's bytes (magic, status 1, length, JSON cut to the largest body)."""
    body = json.dumps({"reason": reason, "message": message}).encode()[:MAX_REFUSAL_BYTES]
    return MAGIC + bytes((STATUS_REFUSED,)) + LEN16.pack(len(body)) + body


def encode_payload_head(size: int) -> bytes:
    """The head of an answer carrying a payload of ``size`` bytes (the bytes follow it)."""
    return MAGIC + bytes((STATUS_PAYLOAD,)) + SIZE.pack(size)


def recv_exact(sock: socket.socket, size: int, deadline: float) -> bytes:
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
