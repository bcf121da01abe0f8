"""The chunk messages of ``lensemble.proto`` as frames: built and read without protobuf's copies.

``ModelChunk`` and ``UpdateChunk`` carry a payload's bytes in their last field, ``data``. A
sender frames a chunk with :func:`~lensemble.network.shared.streams.with_bytes_field` (and a
serializer that passes bytes through, :func:`passthrough`); a receiver reads it with
:func:`parse_update_frame` (the coordinator) or :func:`parse_model_frame` (a participant), which
take the data field as a view of the received frame and let protobuf parse only the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError

from lensemble.network.shared.proto import lensemble_pb2 as pb
from lensemble.network.shared.streams import FrameError, split_bytes_field

#: The service's full name, as gRPC routes it.
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Coordinator"].full_name
#: Full method names of SubmitUpdate and FetchModel, as gRPC routes them.
SUBMIT_METHOD = f"/{SERVICE_NAME}/SubmitUpdate"
FETCH_METHOD = f"/{SERVICE_NAME}/FetchModel"

#: Field number of ``ModelChunk.data`` (its last field, lensemble.proto).
MODEL_DATA_FIELD = pb.ModelChunk.DESCRIPTOR.fields_by_name["data"].number
#: Field number of ``UpdateChunk.data`` (its last field): participants frame it, SubmitUpdate
#: splits it.
UPDATE_DATA_FIELD = pb.UpdateChunk.DESCRIPTOR.fields_by_name["data"].number


def passthrough(frame: bytes) -> bytes:
    """The serializer of a call whose messages are already framed: the bytes as they are."""
    return frame


@dataclass(frozen=True)
class UpdateFrame:
    """One received ``UpdateChunk``, as :func:`parse_update_frame` read it.

    Attributes:
        header: The header (the first chunk's), or None.
        data: The chunk's payload bytes: a view of the received frame, not a copy.
        error: Why the frame is malformed (then ``header`` is None and ``data`` empty), else
            None.
    """

    header: pb.UpdateHeader | None
    data: memoryview
    error: str | None = None


def parse_update_frame(raw: bytes) -> UpdateFrame:
    """SubmitUpdate's request deserializer: never raises, whatever the peer sent.

    The data field is split off without a copy (:func:`streams.split_bytes_field`), and only
    the rest is parsed by protobuf; a malformed frame becomes an :class:`UpdateFrame` with
    ``error`` set, which the handler refuses as ``bad_payload``.
    """
    try:
        other, data = split_bytes_field(raw, UPDATE_DATA_FIELD)
        message = pb.UpdateChunk.FromString(other)
    except FrameError as exc:
        return UpdateFrame(None, memoryview(b""), exc.message)
    except DecodeError:
        return UpdateFrame(None, memoryview(b""), "a chunk frame is not a valid UpdateChunk.")
    return UpdateFrame(message.header if message.HasField("header") else None, data)


@dataclass(frozen=True)
class ModelFrame:
    """One received ``ModelChunk``, as :func:`parse_model_frame` read it.

    Attributes:
        total_bytes: The payload's declared size (bytes; set in the first chunk only, else 0).
        data: The chunk's payload bytes: a view of the received frame, not a copy.
        error: Why the frame is malformed (then ``data`` is empty), else None.
    """

    total_bytes: int
    data: memoryview
    error: str | None = None


def parse_model_frame(raw: bytes) -> ModelFrame:
    """FetchModel's response deserializer (the participant's): never raises.

    The participant's mirror of :func:`parse_update_frame`: the data field is taken as a view
    of the frame gRPC handed over, where ``ModelChunk.FromString`` followed by ``.data`` copied
    each chunk twice more (protobuf copies the field when parsing, and again on every access).
    The coordinator is no more trusted than any peer: a malformed frame becomes a
    :class:`ModelFrame` with ``error`` set, which the download refuses.
    """
    try:
        other, data = split_bytes_field(raw, MODEL_DATA_FIELD)
        message = pb.ModelChunk.FromString(other)
    except FrameError as exc:
        return ModelFrame(0, memoryview(b""), exc.message)
    except DecodeError:
        return ModelFrame(0, memoryview(b""), "a chunk frame is not a valid ModelChunk.")
    return ModelFrame(message.total_bytes, data)
