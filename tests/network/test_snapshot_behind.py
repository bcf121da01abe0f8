"""A network participant writes its inner-state snapshot while its update streams.

The guarantee kept: the update's last chunk leaves only once the snapshot is durable, so the
coordinator never counts an update whose inner state could still be lost.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lensemble.config.load import validate_mapping
from lensemble.durable import DiskFull
from lensemble.federation.checkpoint import InnerStateStore
from lensemble.federation.messages import RoundOpening
from lensemble.federation.participant import Contribution, Participant
from lensemble.federation.payload import encode, manifest, model_hash
from lensemble.network.participant.client import CoordinatorClient
from lensemble.network.shared.proto import lensemble_pb2 as pb
from tests.support.federation import (
    QuadraticLearner,
    initial_params,
    small_config,
    small_federation,
)

pytestmark = pytest.mark.unit


def _client(chunk_bytes: int) -> CoordinatorClient:
    config = validate_mapping(
        {
            "federation": small_federation(),
            "network": {
                "auth": "insecure",
                "tls": {"enabled": False},
                "chunk_bytes": chunk_bytes,
                "rpc_timeout_s": 5,
            },
        }
    )
    return CoordinatorClient(config, "alpha")  # a lazy channel: nothing is dialled


def _opening() -> RoundOpening:
    return RoundOpening(0, 0, 0, "sha256:00", deadline_s=1e9)


def _recording_call(events: list[str]) -> Any:
    def call(frames: Iterator[bytes], timeout: float, metadata: Any) -> pb.SubmitReply:
        for frame in frames:
            events.append(f"chunk {len(frame)}")
        return pb.SubmitReply(accepted=True, reason="accepted")

    return call


def test_the_last_chunk_waits_for_the_snapshot() -> None:
    client = _client(chunk_bytes=1024)
    events: list[str] = []
    client._submit_update = _recording_call(events)
    contribution = Contribution(b"x" * 4000, "sha256:00", 0.0, 0.0)
    reply = client.submit(_opening(), contribution, before_last=lambda: events.append("settled"))
    assert reply.accepted
    assert [e.split()[0] for e in events] == ["chunk", "chunk", "chunk", "settled", "chunk"]


def test_a_failed_snapshot_ends_the_stream_short_and_is_raised() -> None:
    client = _client(chunk_bytes=1024)
    events: list[str] = []
    client._submit_update = _recording_call(events)
    contribution = Contribution(b"x" * 4000, "sha256:00", 0.0, 0.0)

    def disk_full() -> None:
        raise DiskFull("no space left in /state: 0 B free, needs 4 kB;")

    with pytest.raises(DiskFull, match="no space left"):
        client.submit(_opening(), contribution, before_last=disk_full)
    assert len(events) == 3  # the last chunk never left


def _participant(tmp_path: Path) -> tuple[Participant, RoundOpening, bytes]:
    config = small_config()
    params = initial_params(3)
    participant = Participant(config, "alpha", QuadraticLearner("alpha", 3), manifest(params))
    participant.states = InnerStateStore(tmp_path, "alpha")
    hash_ = model_hash(params, 0, "")
    payload = encode(params, {"kind": "global-model", "version": "0", "model_hash": hash_})
    return participant, RoundOpening(0, 0, 0, hash_, deadline_s=1e9), payload


def test_a_snapshot_written_behind_is_durable_once_settled(tmp_path: Path) -> None:
    participant, opening, payload = _participant(tmp_path)
    participant.contribute(opening, payload, snapshot_behind=True)
    participant.settle_snapshot()
    assert participant.states is not None
    assert participant.states.latest_before(1) is not None


def test_forgetting_a_round_waits_for_its_snapshot_so_none_survives(tmp_path: Path) -> None:
    participant, opening, payload = _participant(tmp_path)
    participant.contribute(opening, payload, snapshot_behind=True)
    assert participant.forget(0, 0)
    assert participant.states is not None
    assert participant.states.latest_before(1) is None


def test_a_snapshot_that_fails_behind_is_raised_when_settled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    participant, opening, payload = _participant(tmp_path)

    def full(*args: object) -> None:
        raise DiskFull(f"no space left in {tmp_path}: 0 B free;")

    monkeypatch.setattr(InnerStateStore, "save", full)
    participant.contribute(opening, payload, snapshot_behind=True)
    with pytest.raises(DiskFull, match="no space left"):
        participant.settle_snapshot()
    participant.settle_snapshot()  # raised once; nothing pending afterwards
