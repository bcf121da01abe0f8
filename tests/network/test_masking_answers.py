"""The coordinator's side of masked rounds over gRPC: stage messages out, hostile answers refused.

The handlers (:mod:`lensemble.network.coordinator.masking_service`) run against a real
:class:`GrpcCoordinatorTransport` whose coordinator thread is collecting one stage
(:meth:`MaskingExchange.exchange` in a thread); every refused answer is named by its reason and
never reaches the session, and the stage still ends with exactly the honest answers.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from lensemble.config import LensembleConfig
from lensemble.config.load import validate_mapping
from lensemble.federation.intake import Intake, Landing
from lensemble.federation.masking import SessionKey, dimension
from lensemble.federation.messages import RoundOpening
from lensemble.federation.payload import manifest
from lensemble.federation.secagg.messages import MaskedInput
from lensemble.network.coordinator.authenticator import Authenticator
from lensemble.network.coordinator.masking_service import MaskingService
from lensemble.network.coordinator.service import CoordinatorService
from lensemble.network.coordinator.transport import GrpcCoordinatorTransport
from lensemble.network.shared import transport_errors as nerr
from lensemble.network.shared.identity import PARTICIPANT_KEY
from lensemble.network.shared.masking_limits import (
    FRAME_ROOM,
    REPORT_ENTRIES,
    answer_limits,
    bad_report,
)
from lensemble.network.shared.proto import lensemble_pb2 as pb
from tests.support.federation import initial_params
from tests.support.network import network_mapping

IDS = ["alpha", "bravo", "charlie", "delta"]
SESSION = SessionKey(0, 0, 0)


class _Aborted(Exception):
    pass


class _Context:
    """The parts of a gRPC servicer context the handlers use."""

    def __init__(self, caller: str) -> None:
        self.caller = caller
        self.code: grpc.StatusCode | None = None
        self.trailing: dict[str, str] = {}

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((PARTICIPANT_KEY, self.caller),)

    def set_trailing_metadata(self, items: Any) -> None:
        self.trailing = dict(items)

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        raise _Aborted

    def is_active(self) -> bool:
        return True


def _config(tmp: Path) -> LensembleConfig:
    return validate_mapping(network_mapping(tmp, aggregation="masking"))


class _Stage:
    """A transport with every participant present, collecting one stage in a thread."""

    def __init__(
        self,
        tmp: Path,
        stage: str,
        addressed: list[str],
        fetched: list[str] | None = None,
        groups: dict[str, int] | None = None,
    ) -> None:
        config = _config(tmp)
        self.transport = GrpcCoordinatorTransport(config, next_round=0)
        for pid in IDS:
            assert self.transport.join(pid, self.transport.config_hash, "{}", "x").accepted
            self.transport.presence_opened(pid)
        opening = RoundOpening(0, 0, 0, "sha256:" + "0" * 64, time.monotonic() + 60)
        self.transport.open_round(opening, b"model")
        arch = manifest(initial_params(config.run.root_seed))
        self.d = dimension(arch)
        service = CoordinatorService(self.transport, Authenticator(config, IDS), 1 << 20)
        self.masking = MaskingService(service, answer_limits(config, arch))
        self.answers: list[tuple[str, bytes]] = []
        # Each addressed participant in its group's session (group 0 unless ``groups`` says).
        sessions = {p: SessionKey(0, 0, (groups or {}).get(p, 0)) for p in addressed}
        outgoing = {p: (sessions[p], b"message") for p in addressed}
        self.thread = threading.Thread(
            target=lambda: self.answers.extend(self.transport.exchange(stage, outgoing))
        )
        self.started = time.monotonic()
        self.thread.start()
        for pid in addressed if fetched is None else fetched:  # each fetches its message
            message = self.transport.masking.next_message(pid, 0, 0, time.monotonic() + 5)
            assert message is not None and message.stage == stage
            assert message.payload == b"message" and message.session == sessions[pid]

    def send(
        self,
        caller: str,
        data: bytes,
        *,
        chunks: list[pb.MaskingAnswerChunk] | None = None,
        **h: Any,
    ) -> pb.MaskingAnswerReply | _Context:
        header = {
            "participant_id": caller,
            "session": self.transport.session,
            "round_index": 0,
            "attempt": 0,
            "group": 0,
            "stage": "share",
            "total_bytes": len(data),
            "payload_hash": "sha256:" + hashlib.sha256(data).hexdigest(),
            **h,
        }
        stream = chunks or [
            pb.MaskingAnswerChunk(header=pb.MaskingAnswerHeader(**header), data=data)
        ]
        context = _Context(caller)
        try:
            return self.masking.AnswerStage(iter(stream), context)
        except _Aborted:
            return context

    def finish(self) -> list[tuple[str, bytes]]:
        self.thread.join(30)
        assert not self.thread.is_alive()
        return self.answers


def _refused(outcome: Any, reason: str) -> None:
    assert isinstance(outcome, _Context), outcome
    assert outcome.trailing[nerr.REASON_KEY] == reason


def test_hostile_answers_are_refused_by_name_and_the_stage_keeps_only_honest_ones(
    tmp_path: Path,
) -> None:
    stage = _Stage(tmp_path, "share", ["alpha", "bravo"])
    accepted = pb.MaskingAnswerReply(outcome="accepted", current_round=0)
    assert stage.send("alpha", b"alpha's shares") == accepted
    _refused(stage.send("alpha", b"again"), nerr.DUPLICATE_ANSWER)
    _refused(stage.send("bravo", b"x", stage="gossip"), nerr.UNKNOWN_STAGE)
    _refused(stage.send("bravo", b"x", group=5), nerr.UNKNOWN_SESSION)
    _refused(stage.send("bravo", b"x", attempt=3), nerr.UNKNOWN_SESSION)
    _refused(stage.send("bravo", b"x", stage="mask"), nerr.CLOSED_STAGE)
    _refused(stage.send("charlie", b"x"), nerr.NOT_ADDRESSED)
    _refused(stage.send("bravo", b"x", total_bytes=1 << 30), "too_large")
    _refused(stage.send("bravo", b"x", payload_hash="sha256:" + "0" * 64), "hash_mismatch")
    _refused(stage.send("bravo", b"short", total_bytes=10), "bad_payload")
    too_many = {f"k{i}": "1" for i in range(REPORT_ENTRIES + 1)}
    _refused(stage.send("bravo", b"x", report=too_many), "bad_payload")
    _refused(stage.send("bravo", b"x", chunks=[pb.MaskingAnswerChunk(data=b"x")]), "bad_payload")
    _refused(stage.send("bravo", b"x", participant_id="alpha"), nerr.BAD_CREDENTIALS)
    _refused(stage.send("bravo", b"x", session="0" * 16), nerr.STALE_SESSION)
    _refused(stage.send("bravo", b"x", stage="s" * 33), nerr.OVERSIZED)
    assert stage.send("bravo", b"bravo's shares") == accepted
    assert stage.finish() == [("alpha", b"alpha's shares"), ("bravo", b"bravo's shares")]
    _refused(stage.send("bravo", b"late"), nerr.UNKNOWN_SESSION)  # the stage is over


def test_one_stage_collects_every_groups_session_and_each_answer_counts_in_its_own(
    tmp_path: Path,
) -> None:
    # All groups' sessions run each stage at once (one deadline); an answer names its session,
    # and one sent for another group's session, or for a group not running, never counts.
    groups = {"alpha": 0, "bravo": 0, "charlie": 1, "delta": 1}
    stage = _Stage(tmp_path, "share", IDS, groups=groups)
    _refused(stage.send("charlie", b"x", group=0), nerr.NOT_ADDRESSED)
    _refused(stage.send("alpha", b"x", group=2), nerr.UNKNOWN_SESSION)
    for pid in reversed(IDS):
        reply = stage.send(pid, pid.encode(), group=groups[pid])
        assert reply == pb.MaskingAnswerReply(outcome="accepted", current_round=0)
    assert stage.finish() == [(pid, pid.encode()) for pid in reversed(IDS)]


def test_a_masked_vector_is_bounded_by_d_and_carries_its_report(tmp_path: Path) -> None:
    stage = _Stage(tmp_path, "mask", ["alpha", "bravo", "charlie"])
    vector = MaskedInput(b"\0" * 32, "alpha", np.zeros(stage.d + 2, "<u8"))
    honest = vector.encode()
    assert len(honest) <= answer_limits(_config(tmp_path), manifest(initial_params(3)))["mask"]
    _refused(
        stage.send("bravo", b"x", stage="mask", total_bytes=FRAME_ROOM + 8 * (stage.d + 3)),
        "too_large",
    )
    report = {"mean_loss": "0.5", "heldout_loss": "0.25"}
    reply = stage.send("alpha", honest, stage="mask", report=report)
    assert isinstance(reply, pb.MaskingAnswerReply)
    stage.transport.presence_closed("bravo", broken=True)  # gone: no one waits for it
    assert stage.send("charlie", honest, stage="mask").outcome == "accepted"  # type: ignore[union-attr]
    assert [pid for pid, _ in stage.finish()] == ["alpha", "charlie"]
    assert stage.transport.masked_reports() == {"alpha": report, "charlie": {}}


def test_a_stage_ends_at_its_deadline_without_the_silent(tmp_path: Path) -> None:
    mapping = network_mapping(tmp_path, aggregation="masking")
    mapping["network"]["rpc_timeout_s"] = 0.5
    config = validate_mapping(mapping)
    transport = GrpcCoordinatorTransport(config, next_round=0)
    for pid in IDS:
        transport.join(pid, transport.config_hash, "{}", "x")
        transport.presence_opened(pid)
    transport.open_round(RoundOpening(0, 0, 0, "sha256:" + "0" * 64, time.monotonic()), b"m")
    started = time.monotonic()
    assert list(transport.exchange("share", dict.fromkeys(IDS, (SESSION, b"m")))) == []
    assert time.monotonic() - started >= 2 * 0.5  # the stage's deadline, not forever


def test_a_stage_watcher_hears_that_its_attempt_is_over(tmp_path: Path) -> None:
    stage = _Stage(tmp_path, "share", ["alpha"])
    masking = stage.masking
    closed = list(
        masking.MaskingStages(
            pb.MaskingStagesRequest(
                participant_id="bravo", session=stage.transport.session, round_index=4
            ),
            _Context("bravo"),
        )
    )
    assert [m.closed for m in closed] == [True]
    stage.send("alpha", b"done")
    stage.finish()


def test_a_message_is_never_handed_to_a_call_that_is_gone(tmp_path: Path) -> None:
    stage = _Stage(tmp_path, "share", ["alpha", "bravo"], fetched=["alpha"])
    exchange = stage.transport.masking
    soon = time.monotonic() + 0.2
    assert exchange.next_message("bravo", 0, 0, soon, alive=lambda: False) is None
    message = exchange.next_message("bravo", 0, 0, time.monotonic() + 5)  # the next call has it
    assert message is not None and message.payload == b"message"
    assert exchange.next_message("bravo", 0, 0, time.monotonic() + 0.2) is None  # once only
    stage.send("alpha", b"a")
    stage.send("bravo", b"b")
    assert [pid for pid, _ in stage.finish()] == ["alpha", "bravo"]


@pytest.mark.parametrize(
    ("report", "refused"),
    [
        ({"mean_loss": "0.5"}, False),
        ({f"k{i}": "v" for i in range(REPORT_ENTRIES + 1)}, True),
        ({"mean_loss": "1" * 65}, True),
        ({"k" * 65: "1"}, True),
    ],
)
def test_reports_are_bounded(report: dict[str, str], refused: bool) -> None:
    assert (bad_report(report) is not None) == refused


def test_every_stage_has_a_bound_and_the_masked_vector_grows_with_d(tmp_path: Path) -> None:
    config = _config(tmp_path)
    arch = manifest(initial_params(3))
    limits = answer_limits(config, arch)
    assert set(limits) == {"advertise", "share", "mask", "consistency", "unmask"}
    assert limits["mask"] == FRAME_ROOM + 8 * (dimension(arch) + 2)


def test_a_stage_does_not_wait_for_who_is_missing_for_a_known_reason(tmp_path: Path) -> None:
    stage = _Stage(tmp_path, "share", ["alpha", "bravo", "charlie"], fetched=["alpha"])
    transport = stage.transport
    transport.abstain("bravo", 0, 0, "rank_failure")  # sits the attempt out
    transport.leave("charlie", "bye")  # left the run
    stage.send("alpha", b"a")
    assert stage.finish() == [("alpha", b"a")]
    # It ended on the answers, well before the stage's deadline (2 x rpc_timeout_s = 8 s).
    assert time.monotonic() - stage.started < 2 * transport.config.network.rpc_timeout_s


def test_a_large_answer_lands_in_a_spool_file_and_a_refused_one_gives_it_back(
    tmp_path: Path,
) -> None:
    # N masked vectors uploading at once must not be N vectors in memory: each lands in a spool
    # file as its chunks arrive and reaches the session as a view of that file; a stream that
    # fails its hash never reaches the session and its file goes back.
    stage = _Stage(tmp_path, "mask", ["alpha", "bravo", "charlie"])
    given_back: list[int] = []
    landed: list[int] = []

    def land(size: int) -> Landing:
        landed.append(size)
        return Landing(os.open(tmp_path, os.O_TMPFILE | os.O_RDWR), size, given_back.append)

    stage.transport.attach(Intake(land))
    size = 3 << 20
    stage.masking.limits["mask"] = size
    honest = np.random.default_rng(0).bytes(size)

    def chunked(caller: str, data: bytes, declared: str) -> list[pb.MaskingAnswerChunk]:
        header = pb.MaskingAnswerHeader(
            participant_id=caller,
            session=stage.transport.session,
            stage="mask",
            total_bytes=len(data),
            payload_hash=declared,
        )
        step = 1 << 20
        parts = [data[i : i + step] for i in range(0, len(data), step)]
        return [pb.MaskingAnswerChunk(header=header, data=parts[0])] + [
            pb.MaskingAnswerChunk(data=part) for part in parts[1:]
        ]

    digest = "sha256:" + hashlib.sha256(honest).hexdigest()
    wrong = "sha256:" + "0" * 64
    _refused(stage.send("bravo", honest, chunks=chunked("bravo", honest, wrong)), "hash_mismatch")
    assert len(given_back) == 1  # the refused stream's file, at once
    reply = stage.send("alpha", honest, chunks=chunked("alpha", honest, digest))
    assert isinstance(reply, pb.MaskingAnswerReply)
    stage.transport.presence_closed("bravo", broken=True)
    stage.transport.presence_closed("charlie", broken=True)
    ((pid, answer),) = stage.finish()
    assert (pid, landed) == ("alpha", [size, size])
    assert isinstance(answer, memoryview) and answer == honest
    del answer
    stage.answers.clear()
    assert len(given_back) == 2  # the session dropped the view: the file goes back
