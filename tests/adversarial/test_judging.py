"""Untrusted bytes never crash the coordinator's judging; each problem is a classified rejection.

The cases of issue 12: a header of 5,000 ``[`` (RecursionError on main), oversized headers,
unsupported dtypes, int8 scales of 2.6e36, metadata outside the allow-list or too long, absurd
self-reported statistics, pickles, and an unforeseen exception inside judging.
"""

from __future__ import annotations

import json
import pickle
import struct

import pytest
import torch

from lensemble.federation import admission as admission_module
from lensemble.federation.coordinator import Coordinator
from lensemble.federation.messages import Reason, RoundOpening, Submission
from lensemble.federation.payload import bytes_hash, encode, manifest
from lensemble.federation.quantization import quantize
from tests.support.federation import initial_params, small_config


def open_coordinator(**federation: object) -> Coordinator:
    """A coordinator collecting round 0 (as ``run_attempt`` opens it)."""
    coordinator = Coordinator(small_config(**federation), initial_params())
    opening = RoundOpening(0, 0, 0, coordinator.model_hash, 1e9)
    coordinator.admission.open(opening)
    return coordinator


def metadata(coordinator: Coordinator, **extra: str) -> dict[str, str]:
    fed = coordinator.config.federation
    return {
        "kind": "pseudo-gradient",
        "round": "0",
        "attempt": "0",
        "participant": "alpha",
        "base_hash": coordinator.model_hash,
        "quantization": fed.quantization,
        "int8_chunk": str(fed.int8_chunk),
        "mean_loss": "0.5",
        "compute_s": "1.0",
        **extra,
    }


def valid_payload(coordinator: Coordinator, value: float = 0.01, **extra: str) -> bytes:
    fed = coordinator.config.federation
    delta = {k: torch.full_like(v, value) for k, v in initial_params().items()}
    return encode(quantize(delta, fed.quantization, fed.int8_chunk), metadata(coordinator, **extra))


def judge(coordinator: Coordinator, payload: bytes, sender: str = "alpha") -> Reason:
    verdict = coordinator.accept(Submission(sender, 0, payload, bytes_hash(payload), 0))
    return verdict.reason


def raw(header: bytes, tail: bytes = b"") -> bytes:
    return struct.pack("<Q", len(header)) + header + tail


def test_a_valid_update_is_accepted() -> None:
    coordinator = open_coordinator()
    assert judge(coordinator, valid_payload(coordinator)) == Reason.ACCEPTED


@pytest.mark.parametrize(
    "payload",
    [
        raw(b"[" * 5000),  # issue 12: RecursionError escaped accept() on main
        raw(b'{"__metadata__":{"format":' + b"[" * 5000 + b"}"),
        raw(b'{"a":' * 3000 + b"1" + b"}" * 3000),
        raw(b" " * 100_000),  # a header far larger than an update's
        raw(b'{"w":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]}}', b"\x01"),
        raw(b'{"w":{"dtype":["F32"],"shape":[1],"data_offsets":[0,4]}}', bytes(4)),
        raw(b'{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', bytes(4)),
        raw(b'{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}'),
        raw(b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}', bytes(4)),
        raw(b'{"__metadata__":{"format":1}}'),
        raw(b"\xff\xfe{}"),
        pickle.dumps({"w": torch.ones(2)}),
    ],
    ids=[
        "5000-brackets",
        "deep-metadata",
        "deep-objects",
        "huge-header",
        "bool-dtype",
        "list-dtype",
        "negative-shape",
        "overflowing-shape",
        "reversed-offsets",
        "non-string-metadata",
        "not-utf8",
        "pickle",
    ],
)
def test_hostile_payloads_are_bad_payload(payload: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("something was unpickled")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    coordinator = open_coordinator()
    assert judge(coordinator, payload) == Reason.BAD_PAYLOAD
    # The coordinator goes on judging: an honest update is still accepted.
    assert judge(coordinator, valid_payload(coordinator)) == Reason.ACCEPTED


def test_an_unforeseen_exception_is_rejected_not_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    coordinator = open_coordinator()

    def broken(*args: object, **kwargs: object) -> None:
        raise RecursionError("a parser bug nobody foresaw")

    monkeypatch.setattr(admission_module, "decode", broken)
    verdict = coordinator.accept(Submission("alpha", 0, b"x" * 16, bytes_hash(b"x" * 16), 0))
    assert verdict.reason == Reason.BAD_PAYLOAD
    assert "RecursionError" in verdict.message
    assert coordinator.admission.rejections["bad_payload"] == 1
    assert "a bug" in caplog.text


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"evil": "1"}, Reason.BAD_PAYLOAD),  # not on the allow-list
        ({"mean_loss": "9" * 10_000}, Reason.BAD_PAYLOAD),  # 10,000 characters
        ({"compute_s": "1" * 129}, Reason.BAD_PAYLOAD),
    ],
)
def test_metadata_outside_the_allow_list_or_too_long_is_rejected(
    extra: dict[str, str], reason: Reason
) -> None:
    coordinator = open_coordinator()
    assert judge(coordinator, valid_payload(coordinator, **extra)) == reason


@pytest.mark.parametrize(
    ("mean_loss", "compute_s", "expected"),
    [
        ("1e300", "5", {"mean_loss": None, "compute_s": 5.0, "heldout_loss": None}),
        ("nan", "-1", {"mean_loss": None, "compute_s": None, "heldout_loss": None}),
        ("inf", "1e300", {"mean_loss": None, "compute_s": None, "heldout_loss": None}),
        ("0.25", "oops", {"mean_loss": 0.25, "compute_s": None, "heldout_loss": None}),
    ],
)
def test_self_reported_statistics_are_bounded(
    mean_loss: str, compute_s: str, expected: dict[str, float | None]
) -> None:
    coordinator = open_coordinator()
    payload = valid_payload(coordinator, mean_loss=mean_loss, compute_s=compute_s)
    assert judge(coordinator, payload) == Reason.ACCEPTED
    assert coordinator.admission.collection is not None
    assert coordinator.admission.collection.reported["alpha"] == expected


def test_an_int8_scale_above_the_bound_is_out_of_bounds() -> None:
    coordinator = open_coordinator(quantization="int8")
    fed = coordinator.config.federation
    delta = {k: torch.full_like(v, 0.5) for k, v in initial_params().items()}
    wire = quantize(delta, "int8", 0)
    name = sorted(manifest(initial_params()))[0]
    wire[name + "::scale"] = torch.tensor([2.6e36])  # issue 12: accepted on main
    payload = encode(wire, metadata(coordinator))
    assert judge(coordinator, payload) == Reason.OUT_OF_BOUNDS
    assert fed.robustness.max_int8_scale < 2.6e36
    details = (
        coordinator.admission.collection.details["alpha"]
        if coordinator.admission.collection
        else ""
    )
    assert "max_int8_scale" in details


def test_headers_are_bounded_relative_to_the_model() -> None:
    coordinator = open_coordinator()
    padded = valid_payload(coordinator)
    (length,) = struct.unpack("<Q", padded[:8])
    header = json.loads(padded[8 : 8 + length])
    text = json.dumps(header).encode() + b" " * coordinator.admission.max_header_bytes
    assert judge(coordinator, raw(text, padded[8 + length :])) == Reason.BAD_PAYLOAD


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("round", None, Reason.BAD_PAYLOAD),  # issue 41, item 15: was closed_round
        ("attempt", None, Reason.BAD_PAYLOAD),
        ("round", "zero", Reason.BAD_PAYLOAD),
        ("round", "", Reason.BAD_PAYLOAD),
        ("round", "7", Reason.CLOSED_ROUND),  # well-formed, another round: closed_round
        ("attempt", "1", Reason.CLOSED_ROUND),
    ],
)
def test_missing_or_malformed_round_metadata_is_a_bad_payload(
    field: str, value: str | None, reason: Reason
) -> None:
    coordinator = open_coordinator()
    fed = coordinator.config.federation
    delta = {k: torch.full_like(v, 0.01) for k, v in initial_params().items()}
    meta = metadata(coordinator)
    if value is None:
        del meta[field]
    else:
        meta[field] = value
    payload = encode(quantize(delta, fed.quantization, fed.int8_chunk), meta)
    assert judge(coordinator, payload) == reason
