"""What a network round does besides moving bytes: frames, waits and hashes (no wall time).

The coordinator transport waits on events (every state change notifies its condition) rather
than on a polling interval; chunk frames are built with one copy and are byte-identical to
protobuf's; each update is hashed once, while it streams in.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from lensemble.config.load import validate_mapping
from lensemble.federation import admission as admission_module
from lensemble.federation.coordinator import Coordinator
from lensemble.federation.messages import Reason, RoundOpening, Submission, Verdict
from lensemble.federation.participant import Participant
from lensemble.federation.payload import bytes_hash, manifest
from lensemble.network.coordinator import hand_over as hand_over_module
from lensemble.network.coordinator import liveness as liveness_module
from lensemble.network.coordinator import transport as transport_module
from lensemble.network.coordinator.transport import GrpcCoordinatorTransport
from lensemble.network.shared.proto import lensemble_pb2 as pb
from lensemble.network.shared.streams import Assembler, with_bytes_field
from tests.support.network import network_mapping


class _SpyCondition:
    """A condition that records the timeout of every wait (and waits like the real one)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.timeouts: list[float | None] = []

    def __enter__(self) -> Any:
        return self._cond.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._cond.__exit__(*exc)

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout)
        return self._cond.wait(timeout)

    def notify_all(self) -> None:
        self._cond.notify_all()


def _transport(tmp_path: Path) -> tuple[GrpcCoordinatorTransport, _SpyCondition]:
    config = validate_mapping(network_mapping(tmp_path))
    transport = GrpcCoordinatorTransport(config, next_round=0)
    spy = _SpyCondition()
    transport._board.cond = spy  # type: ignore[assignment]
    for pid in config.participant_ids:
        transport.join(pid, transport.config_hash, "{}", "test")
        transport.presence_opened(pid)
    return transport, spy


def _open(transport: GrpcCoordinatorTransport, deadline: float) -> RoundOpening:
    opening = RoundOpening(0, 0, 0, "sha256:" + "0" * 64, deadline)
    transport.open_round(opening, b"model")
    return opening


@pytest.mark.parametrize("module", [transport_module, hand_over_module, liveness_module])
def test_the_transport_has_no_polling_interval(module: Any) -> None:
    assert not hasattr(module, "POLL_S")


def test_receive_sleeps_until_a_submission_arrives_not_for_a_polling_interval(
    tmp_path: Path,
) -> None:
    transport, spy = _transport(tmp_path)
    deadline = transport.now() + 3600
    _open(transport, deadline)
    submission = Submission("alpha", 0, b"update", bytes_hash(b"update"), 0)
    verdicts: list[Any] = []
    handler = threading.Thread(target=lambda: verdicts.append(transport.submit(submission, 0, 60)))

    def submit_once_waiting() -> None:
        while not spy.timeouts:  # the coordinator's thread is asleep in receive()
            threading.Event().wait(0.001)
        handler.start()

    starter = threading.Thread(target=submit_once_waiting)
    starter.start()
    received = transport.receive(deadline)
    starter.join()
    assert received is submission
    # Every sleep of receive() ran to the round's deadline: woken by the submission itself.
    assert spy.timeouts and all(t is not None and t > 3000 for t in spy.timeouts)
    transport.reply(received, Verdict(Reason.ACCEPTED, "ok", 0))
    handler.join()
    assert verdicts[0].accepted


def test_a_broken_presence_stream_ends_the_wait_at_once(tmp_path: Path) -> None:
    transport, spy = _transport(tmp_path)
    deadline = transport.now() + 3600
    _open(transport, deadline)
    for pid in ("alpha", "bravo", "charlie"):
        transport._board.accepted[pid] = "sha256:x"
        transport._board.judged.add(pid)

    def break_delta_once_waiting() -> None:
        while not spy.timeouts:
            threading.Event().wait(0.001)
        transport.presence_closed("delta", broken=True)

    breaker = threading.Thread(target=break_delta_once_waiting)
    breaker.start()
    assert transport.receive(deadline) is None  # nobody left to wait for
    breaker.join()
    assert all(t is not None and t > 3000 for t in spy.timeouts)
    assert transport.absence_reasons() == {"delta": "disconnected"}


def test_receive_wakes_when_a_grace_period_ends(tmp_path: Path) -> None:
    transport, _spy = _transport(tmp_path)
    now = transport.now()
    _open(transport, now + 3600)
    transport.presence_closed("delta", broken=False)  # a window ended: grace until the next
    grace_end = transport._liveness._grace_until["delta"]
    with transport._board.cond:
        wake = transport._liveness.wake_in(3600)
    assert wake == pytest.approx(grace_end - transport.now(), abs=1.0)
    assert wake < 3600


@pytest.mark.parametrize("size", [0, 1, 127, 128, 300, 1 << 20])
def test_frames_are_byte_identical_to_protobuf(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    first = pb.ModelChunk(model_hash="sha256:" + "a" * 64, total_bytes=size)
    ours = with_bytes_field(first.SerializeToString(), 3, memoryview(data))
    theirs = pb.ModelChunk(model_hash=first.model_hash, total_bytes=size, data=data)
    assert ours == theirs.SerializeToString()
    header = pb.UpdateHeader(participant_id="alpha", round_index=7, total_bytes=size)
    update = with_bytes_field(pb.UpdateChunk(header=header).SerializeToString(), 2, data)
    assert update == pb.UpdateChunk(header=header, data=data).SerializeToString()
    assert pb.UpdateChunk.FromString(with_bytes_field(b"", 2, data)).data == data


def test_a_model_download_is_assembled_without_hashing() -> None:
    assembler = Assembler(6, 100, "the model", hashed=False)
    assembler.add(b"abc")
    assembler.add(b"def")
    assert assembler.finish() == b"abcdef"
    with pytest.raises(RuntimeError):
        _ = assembler.payload_hash
    hashed = Assembler(3, 100, "an update")
    hashed.add(b"abc")
    assert hashed.payload_hash == "sha256:" + hashlib.sha256(b"abc").hexdigest()


class _Scale:
    def train_round(self, params: Any, round_index: int, steps: int) -> Any:
        from lensemble.learner import LocalRound

        return LocalRound({k: v * 0.9 for k, v in params.items()}, 0.0, 0.0)

    def inner_state(self) -> dict[str, torch.Tensor]:
        return {}

    def load_inner_state(self, state: Any) -> None:
        pass


@pytest.mark.parametrize("checked", [True, False])
def test_an_update_hashed_by_the_transport_is_not_hashed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checked: bool
) -> None:
    config = validate_mapping(network_mapping(tmp_path))
    theta = {"w": torch.arange(8, dtype=torch.float32)}
    coordinator = Coordinator(config, theta, output_dir=None)
    pid = config.participant_ids[0]
    participant = Participant(config, pid, _Scale(), manifest(theta))
    opening = RoundOpening(0, 0, 0, coordinator.model_hash, 1e12)
    coordinator.admission.open(opening)
    contribution = participant.contribute(opening, coordinator.model_payload())
    calls: list[int] = []
    real = admission_module.bytes_hash
    monkeypatch.setattr(
        admission_module, "bytes_hash", lambda data: calls.append(len(data)) or real(data)
    )
    submission = Submission(
        pid, 0, contribution.payload, contribution.payload_hash, 0, hash_checked=checked
    )
    assert coordinator.accept(submission).reason == Reason.ACCEPTED
    assert calls == ([] if checked else [len(contribution.payload)])
