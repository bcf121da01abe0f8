"""Chunk frames of both streams: the data field taken as a view, the rest parsed by protobuf.

``parse_update_frame`` is the coordinator's request deserializer for every byte a participant
streams (SubmitUpdate), and ``parse_model_frame`` the participant's response deserializer for
every byte of a model download (FetchModel). Both must agree with protobuf on every well-formed
frame and turn every malformed one into a refusal, never an exception, an out-of-bounds read or
a loop.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from lensemble.config.load import validate_mapping
from lensemble.errors import PayloadError
from lensemble.network.participant.client import CoordinatorClient
from lensemble.network.shared.frames import SERVICE_NAME, parse_model_frame, parse_update_frame
from lensemble.network.shared.proto import lensemble_pb2 as pb
from lensemble.network.shared.streams import MAX_FRAME_FIELDS, FrameError, split_bytes_field
from tests.support.network import network_mapping

pytestmark = pytest.mark.unit

HEADER = pb.UpdateHeader(
    participant_id="alpha",
    session="s-1",
    round_index=7,
    attempt=1,
    payload_hash="sha256:" + "a" * 64,
    quantization="int8",
    total_bytes=1 << 40,
    compute_s=1.5,
)


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16_383, 16_384, 1 << 20])
@pytest.mark.parametrize("with_header", [True, False])
def test_a_well_formed_frame_reads_as_protobuf_reads_it(size: int, with_header: bool) -> None:
    data = random.Random(size).randbytes(size)
    message = pb.UpdateChunk(header=HEADER, data=data) if with_header else pb.UpdateChunk(data=data)
    raw = message.SerializeToString()
    frame = parse_update_frame(raw)
    assert frame.error is None
    assert frame.data == data
    assert frame.data.obj is raw or size == 0  # a view of the received frame, not a copy
    assert (frame.header == HEADER) if with_header else frame.header is None


def test_fields_in_any_order_and_unknown_ones_are_read_as_protobuf_does() -> None:
    data = b"payload"
    header = pb.UpdateChunk(header=HEADER).SerializeToString()
    body = pb.UpdateChunk(data=data).SerializeToString()
    unknown = bytes([0x18, 0x05, 0x25, 1, 2, 3, 4, 0x29, *range(8)])  # fields 3 (varint), 4, 5
    raw = body + unknown + header
    frame = parse_update_frame(raw)
    assert frame.error is None and frame.data == data and frame.header == HEADER
    rest, view = split_bytes_field(raw, 2)
    assert view == data and pb.UpdateChunk.FromString(rest).header == HEADER


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"\x12\x05abc", "longer than the frame"),  # data declares 5 bytes, 3 follow
        (b"\x12", "truncated"),  # the length is missing
        (b"\x12\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", "overlong"),
        (b"\x80", "truncated"),  # a tag cut inside its varint
        (b"\x12\x01a\x12\x01b", "twice"),
        (b"\x02\x00", "numbered 0"),
        (b"\x0b\x0c", "wire type 3"),  # a group
        (b"\x0f", "wire type 7"),
        (b"\x09\x01\x02", "ends inside a field"),  # fixed64 with 2 bytes
    ],
)
def test_a_malformed_frame_is_refused_by_name(raw: bytes, words: str) -> None:
    with pytest.raises(FrameError, match=words):
        split_bytes_field(raw, 2)
    frame = parse_update_frame(raw)
    assert frame.header is None and not frame.data and words in (frame.error or "")


def test_a_frame_of_many_tiny_fields_is_refused_after_a_few() -> None:
    # A chunk-sized frame of 2-byte unknown fields: walking all of them would hold the GIL for
    # about a second; the walk stops at the bound instead.
    raw = b"\x18\x00" * (1 << 19)
    with pytest.raises(FrameError, match=f"more than {MAX_FRAME_FIELDS} fields"):
        split_bytes_field(raw, 2)
    legal = b"\x18\x00" * (MAX_FRAME_FIELDS - 1) + pb.UpdateChunk(data=b"ok").SerializeToString()
    assert split_bytes_field(legal, 2)[1] == b"ok"


def test_a_header_protobuf_cannot_parse_is_refused_not_raised() -> None:
    raw = b"\x0a\x02\x0a\xff"  # header: a string field whose length runs past the header
    frame = parse_update_frame(raw)
    assert frame.header is None and frame.error == "a chunk frame is not a valid UpdateChunk."


def test_random_bytes_never_raise_and_never_read_past_the_frame() -> None:
    rng = random.Random(19)
    valid = pb.UpdateChunk(header=HEADER, data=b"x" * 300).SerializeToString()
    for _ in range(3000):
        if rng.random() < 0.5:
            raw = rng.randbytes(rng.randrange(0, 64))
        else:  # a valid frame with a few bytes flipped or cut: close to what parses
            raw = bytearray(valid[: rng.randrange(0, len(valid) + 1)])
            for _ in range(rng.randrange(1, 4)):
                if raw:
                    raw[rng.randrange(len(raw))] = rng.randrange(256)
            raw = bytes(raw)
        frame = parse_update_frame(raw)
        if frame.error is None:
            assert len(frame.data) <= len(raw)
            reference = pb.UpdateChunk.FromString(raw)  # protobuf accepts it too
            assert bytes(frame.data) == reference.data
        else:
            assert frame.header is None and not frame.data


# --------------------------------------------------------------------- FetchModel (participant)
@pytest.mark.parametrize("size", [0, 1, 16_384, 1 << 20])
@pytest.mark.parametrize("first", [True, False])
def test_a_model_frame_reads_as_protobuf_reads_it(size: int, first: bool) -> None:
    data = random.Random(size).randbytes(size)
    extra = {"model_hash": "sha256:" + "b" * 64, "total_bytes": 1 << 33} if first else {}
    raw = pb.ModelChunk(data=data, **extra).SerializeToString()
    frame = parse_model_frame(raw)
    assert frame.error is None and frame.data == data
    assert frame.data.obj is raw or size == 0  # a view of the received frame, not a copy
    assert frame.total_bytes == (1 << 33 if first else 0)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"\x1a\x05abc", "longer than the frame"),  # data (field 3) declares 5 bytes, 3 follow
        (b"\x1a\x01a\x1a\x01b", "twice"),
        (b"\x10", "truncated"),  # total_bytes without its value
        (b"\x0a\x01\xff", "not a valid ModelChunk"),  # model_hash is not UTF-8
    ],
)
def test_a_malformed_model_frame_is_refused_by_name(raw: bytes, words: str) -> None:
    frame = parse_model_frame(raw)
    assert not frame.data and frame.total_bytes == 0 and words in (frame.error or "")


class _HostileCoordinator:
    """A gRPC server whose FetchModel streams the given raw frames, whatever they hold."""

    def __init__(self, port: int, frames: list[bytes]) -> None:
        def fetch(_request: bytes, _context: Any) -> Iterator[bytes]:
            yield from frames

        handler = grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "FetchModel": grpc.unary_stream_rpc_method_handler(
                    fetch, request_deserializer=bytes, response_serializer=bytes
                )
            },
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.server.start()


def _fetch(tmp_path: Path, frames: list[bytes], model_bytes: int) -> bytes:
    mapping = network_mapping(tmp_path)
    mapping["network"].update(auth="insecure", tls={"enabled": False}, host="127.0.0.1")
    config = validate_mapping(mapping)
    coordinator = _HostileCoordinator(config.network.port, frames)
    client = CoordinatorClient(config, "alpha")
    try:
        return client.fetch(pb.RoundAnnouncement(round_index=4, model_bytes=model_bytes))
    finally:
        client.close()
        coordinator.server.stop(None)


def test_a_download_assembles_the_frames_it_receives(tmp_path: Path) -> None:
    data = random.Random(3).randbytes(300_000)
    frames = [
        pb.ModelChunk(total_bytes=len(data), data=data[:100_000]).SerializeToString(),
        pb.ModelChunk(data=data[100_000:]).SerializeToString(),
    ]
    assert _fetch(tmp_path, frames, len(data)) == data


@pytest.mark.parametrize(
    ("frames", "words"),
    [
        ([b"\x10\x04\x1a\x09abc"], "the model of round 4 arrived in a malformed chunk"),
        ([pb.ModelChunk(total_bytes=4, data=b"abcde").SerializeToString()], "sent more than"),
        ([pb.ModelChunk(total_bytes=9, data=b"abc").SerializeToString()], "truncated: 3 of 9"),
        ([pb.ModelChunk(total_bytes=1 << 40).SerializeToString()], "above the"),
    ],
)
def test_a_hostile_coordinator_s_download_is_refused_naming_why(
    tmp_path: Path, frames: list[bytes], words: str
) -> None:
    with pytest.raises(PayloadError, match=words):
        _fetch(tmp_path, frames, 9)
