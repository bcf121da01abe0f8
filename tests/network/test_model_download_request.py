"""The model download's request parser: any bytes give a request or a sentence, never a raise."""

from __future__ import annotations

import random

import pytest

from lensemble.network.shared import download_protocol as protocol

pytestmark = pytest.mark.unit

MODEL_HASH = "sha256:" + "ab" * 32
SESSION = "0123456789abcdef"


def test_a_request_round_trips() -> None:
    request = protocol.DownloadRequest("alpha", SESSION, MODEL_HASH, "t" * 40)
    wire = protocol.encode_request(request)
    assert wire.startswith(protocol.MAGIC)
    assert protocol.parse_request(wire[len(protocol.MAGIC) + 4 :]) == request


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b'{"participant_id":"a","session":"s"}', "no model_hash"),
        (b'{"participant_id":"a","session":"s","model_hash":"h","x":1}', "unknown fields"),
        (b'{"participant_id":1,"session":"s","model_hash":"h"}', "participant_id is not a str"),
        (b'{"participant_id":"' + b"a" * 65 + b'","session":"s","model_hash":"h"}', "longer"),
        (b"[" * 3000 + b"]" * 3000, "not"),
    ],
    ids=["missing", "unknown", "not-a-string", "too-long", "deep-nesting"],
)
def test_a_malformed_request_body_is_named(body: bytes, named: str) -> None:
    said = protocol.parse_request(body)
    assert isinstance(said, str) and named in said


def test_no_bytes_make_the_request_parser_raise() -> None:
    rng = random.Random(19)
    good = protocol.encode_request(protocol.DownloadRequest("alpha", SESSION, MODEL_HASH))[
        len(protocol.MAGIC) + 4 :
    ]
    for _ in range(3000):
        body = bytearray(good)
        for _ in range(rng.randint(1, 8)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        result = protocol.parse_request(bytes(body))
        assert isinstance(result, (str, protocol.DownloadRequest))
    for _ in range(500):
        assert isinstance(protocol.parse_request(rng.randbytes(rng.randint(0, 200))), str)
