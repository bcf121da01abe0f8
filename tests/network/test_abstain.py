"""The coordinator side of ``Abstain``, in one process (unit tier).

A participant may sit out the open attempt with a reason of ``ABSTENTION_REASONS``: the ledger
then names that reason exactly as the in-process transport does, and the attempt stops waiting
for it. Everything in the request is hostile until checked; every refusal below must carry its
gRPC status and reason and leave the transport's state as it was.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc
import pytest

from lensemble.config import LensembleConfig
from lensemble.config.load import validate_mapping
from lensemble.errors import OverlapBaseMissing, RankFailure
from lensemble.federation.coordinator import Coordinator
from lensemble.federation.faults import parse_faults
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.messages import (
    ABSTENTION_REASONS,
    NO_BASE_MODEL,
    PRIVACY_BUDGET,
    RANK_FAILURE,
    Reason,
    RoundOpening,
    Submission,
    Verdict,
)
from lensemble.federation.participant import Participant
from lensemble.federation.payload import bytes_hash, manifest
from lensemble.network.coordinator.authenticator import Authenticator
from lensemble.network.coordinator.rejection import Rejection
from lensemble.network.coordinator.service import CoordinatorService
from lensemble.network.coordinator.transport import GrpcCoordinatorTransport
from lensemble.network.coordinator.uploads import Abstention
from lensemble.network.shared import transport_errors as nerr
from lensemble.network.shared.identity import PARTICIPANT_KEY
from lensemble.network.shared.peer_text import ABSTAIN_LIMITS
from lensemble.network.shared.proto import lensemble_pb2 as pb
from tests.support.federation import (
    QuadraticLearner,
    RankFailingLearner,
    build,
    initial_params,
    small_federation,
)

IDS = ["alpha", "bravo", "charlie", "delta"]


def _config(**federation: Any) -> LensembleConfig:
    tls = {"enabled": False, "client_auth": False}
    return validate_mapping(
        {
            "federation": small_federation(**federation),
            "network": {"rpc_timeout_s": 5, "auth": "insecure", "tls": tls},
            "run": {"root_seed": 3},
        }
    )


def _opening(round_index: int = 0, attempt: int = 0) -> RoundOpening:
    return RoundOpening(
        round_index, attempt, round_index, "sha256:" + "0" * 64, time.monotonic() + 60
    )


def _joined(config: LensembleConfig | None = None) -> GrpcCoordinatorTransport:
    transport = GrpcCoordinatorTransport(config or _config(), next_round=0)
    for pid in IDS:
        assert transport.join(pid, transport.config_hash, "{}", "x").accepted
        transport.presence_opened(pid)
    return transport


def _accept(transport: GrpcCoordinatorTransport, pid: str, round_index: int = 0) -> None:
    submission = Submission(pid, round_index, b"u", bytes_hash(b"u"), 0)
    transport.reply(submission, Verdict(Reason.ACCEPTED, "accepted.", round_index))


def _state(transport: GrpcCoordinatorTransport) -> tuple[Any, ...]:
    """Everything an abstention may change."""
    return (
        transport.absence_reasons(),
        sorted(transport._board.judged),
        dict(transport._board.abstained),
        dict(transport._board.closed_abstained),
        sorted(transport._board.missed),
        dict(transport._board.accepted),
    )


def _record(transport: GrpcCoordinatorTransport, round_index: int = 0) -> RoundRecord:
    return RoundRecord(
        round=round_index,
        attempt=0,
        state="closed",
        contributors=[],
        excluded={},
        parent_hash="",
        model_hash="sha256:" + "1" * 64,
        mean_inner_loss=None,
        bytes_up=0,
        bytes_down=0,
        quantization="none",
        wall_s=0.0,
        compute_s=0.0,
        non_compute_s=0.0,
        config_hash=transport.config_hash,
    )


def _refused(outcome: Abstention | Rejection, reason: str, status: grpc.StatusCode) -> None:
    assert isinstance(outcome, Rejection), outcome
    assert (outcome.reason, outcome.status) == (reason, status)
    assert outcome.message.endswith(".")


# ------------------------------------------------------------------------------ accepted
def test_the_vocabulary_is_closed_and_names_the_in_process_reasons() -> None:
    assert frozenset({RANK_FAILURE, PRIVACY_BUDGET, NO_BASE_MODEL}) == ABSTENTION_REASONS
    assert (RANK_FAILURE, PRIVACY_BUDGET, NO_BASE_MODEL) == (
        "rank_failure",
        "privacy_budget",
        "no_base_model",
    )
    # The network participant abstains with its error's code: the same words.
    assert (RankFailure.code, OverlapBaseMissing.code) == (RANK_FAILURE, NO_BASE_MODEL)


def test_an_abstention_is_recorded_and_the_attempt_stops_waiting_for_it() -> None:
    transport = _joined()
    transport.open_round(_opening(), b"model")
    for pid in IDS[1:]:
        _accept(transport, pid)
    assert (
        not transport._liveness.nobody_to_wait_for()
    )  # alpha is present: the attempt waits for it
    outcome = transport.abstain("alpha", 0, 0, RANK_FAILURE)
    assert outcome == Abstention(duplicate=False, current_round=0)
    assert transport.absence_reasons() == {"alpha": "rank_failure"}
    assert transport._liveness.nobody_to_wait_for()
    started = time.monotonic()
    assert transport.receive(time.monotonic() + 60) is None  # returns at once, not at 60 s
    assert time.monotonic() - started < 30


def test_the_coordinator_records_the_in_process_ledger_line() -> None:
    """Coordinator + gRPC transport (no server) against the in-process run of the same fault."""
    config = _config(rounds=1)
    reference, transport_ip, _ = build(
        config, faults=parse_faults("rank_kill:alpha@0"), learner=RankFailingLearner
    )
    expected = reference.run(transport_ip).records
    params = initial_params(config.run.root_seed)
    coordinator = Coordinator(config, params, signer=None)
    transport = _joined(config)
    records: list[RoundRecord] = []
    thread = threading.Thread(target=lambda: records.append(coordinator.run_attempt(transport, 0)))
    thread.start()
    try:
        announced = transport.next_announcement((-1, -1), time.monotonic() + 30)
        assert announced is not None
        opening, _ = announced
        payload = transport.model_payload(opening.model_hash)
        assert payload is not None
        assert transport.abstain("alpha", 0, 0, RANK_FAILURE) == Abstention(False, 0)
        for pid in IDS[1:]:
            learner = QuadraticLearner(pid, config.run.root_seed)
            participant = Participant(config, pid, learner, manifest(params))
            made = participant.contribute(opening, payload)
            submission = Submission(pid, 0, made.payload, made.payload_hash, 0)
            verdict = transport.submit(submission, made.compute_s, 30)
            assert isinstance(verdict, Verdict) and verdict.accepted
    finally:
        thread.join(60)
    (record,) = records
    assert record.excluded == expected[0].excluded == {"alpha": "rank_failure"}
    assert record.defences["rejected"] == expected[0].defences["rejected"]
    assert (record.contributors, record.model_hash) == (
        expected[0].contributors,
        expected[0].model_hash,
    )
    assert record.wall_s < config.federation.round_timeout_s / 2


def test_a_repeat_is_a_duplicate_in_the_attempt_and_after_it_closed() -> None:
    transport = _joined()
    transport.open_round(_opening(), b"model")
    assert transport.abstain("alpha", 0, 0, RANK_FAILURE) == Abstention(False, 0)
    before = _state(transport)
    assert transport.abstain("alpha", 0, 0, RANK_FAILURE) == Abstention(True, 0)
    assert _state(transport) == before
    transport.round_closed(_record(transport))
    closed = _state(transport)
    # Its reply was lost: the resend after the close is still answered as a duplicate.
    assert transport.abstain("alpha", 0, 0, RANK_FAILURE) == Abstention(True, 1)
    assert _state(transport) == closed
    # Another participant cannot claim it sat out the closed attempt.
    _refused(
        transport.abstain("bravo", 0, 0, RANK_FAILURE),
        "closed_round",
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    # The next opening starts clean: alpha is waited for again.
    transport.open_round(_opening(1), b"model")
    assert transport.absence_reasons() == {}
    assert "alpha" not in transport._board.judged


# ------------------------------------------------------------------------------ refused
@pytest.mark.parametrize(
    "reason",
    [
        "",
        "timeout",
        "disconnected",
        "RANK_FAILURE",
        "rank_failure ",
        "rank_failure\n",
        "privacy_budget:1",
        "x" * 4096,
    ],
)
def test_an_unknown_reason_is_refused_and_changes_nothing(reason: str) -> None:
    transport = _joined()
    transport.open_round(_opening(), b"model")
    before = _state(transport)
    outcome = transport.abstain("alpha", 0, 0, reason)
    _refused(outcome, nerr.UNKNOWN_ABSTENTION, grpc.StatusCode.INVALID_ARGUMENT)
    assert isinstance(outcome, Rejection) and len(outcome.message) < 400
    assert _state(transport) == before


@pytest.mark.parametrize(
    ("round_index", "attempt"),
    [(0, 0), (2, 0), (1, 1), (1, -1), (-1, 0), (2**63 - 1, 2**31 - 1)],
    ids=["stale-round", "future-round", "other-attempt", "negative-attempt", "negative", "huge"],
)
def test_an_attempt_other_than_the_open_one_is_refused(round_index: int, attempt: int) -> None:
    transport = _joined()
    transport.open_round(_opening(1), b"model")
    before = _state(transport)
    _refused(
        transport.abstain("alpha", round_index, attempt, RANK_FAILURE),
        "closed_round",
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert _state(transport) == before


def test_with_no_round_open_nothing_can_be_sat_out() -> None:
    transport = _joined()
    before = _state(transport)
    _refused(
        transport.abstain("alpha", 0, 0, RANK_FAILURE),
        "closed_round",
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert _state(transport) == before


def test_an_unknown_participant_is_refused() -> None:
    transport = _joined()
    transport.open_round(_opening(), b"model")
    before = _state(transport)
    _refused(
        transport.abstain("mallory", 0, 0, RANK_FAILURE),
        "unknown_participant",
        grpc.StatusCode.PERMISSION_DENIED,
    )
    assert _state(transport) == before


def test_a_participant_that_sent_an_update_cannot_abstain() -> None:
    transport = _joined()
    transport.open_round(_opening(), b"model")
    _accept(transport, "alpha")  # accepted
    rejected = Submission("bravo", 0, b"v", bytes_hash(b"v"), 0)
    transport.reply(rejected, Verdict(Reason.BAD_PAYLOAD, "bad.", 0))  # judged and refused
    transport.upload_refused("charlie", 0, 0, Reason.TOO_LARGE.value)  # refused by the transport
    assert transport.begin_upload("delta")  # still streaming
    before = _state(transport)
    for pid in IDS:
        _refused(
            transport.abstain(pid, 0, 0, RANK_FAILURE),
            nerr.ALREADY_SUBMITTED,
            grpc.StatusCode.FAILED_PRECONDITION,
        )
    assert _state(transport) == before
    # The coordinator's own record names bravo's rejection; the transport only charlie's.
    assert transport.absence_reasons() == {"charlie": "too_large"}


def test_a_queued_update_also_counts_as_sent() -> None:
    transport = _joined()
    transport.open_round(_opening(), b"model")
    submission = Submission("alpha", 0, b"u", bytes_hash(b"u"), 0)
    verdicts: list[Any] = []
    sender = threading.Thread(target=lambda: verdicts.append(transport.submit(submission, 0, 30)))
    sender.start()
    try:
        with transport._board.cond:
            assert transport._board.cond.wait_for(lambda: len(transport._hand_over._inbox) == 1, 10)
        before = _state(transport)
        _refused(
            transport.abstain("alpha", 0, 0, RANK_FAILURE),
            nerr.ALREADY_SUBMITTED,
            grpc.StatusCode.FAILED_PRECONDITION,
        )
        assert _state(transport) == before
    finally:
        arrived = transport.receive(time.monotonic() + 10)
        assert arrived is submission
        transport.reply(submission, Verdict(Reason.ACCEPTED, "accepted.", 0))
        sender.join(10)
    assert verdicts and isinstance(verdicts[0], Verdict) and verdicts[0].accepted


def test_a_participant_that_abstained_cannot_submit_and_keeps_its_reason() -> None:
    transport = _joined()
    transport.open_round(_opening(), b"model")
    assert transport.abstain("alpha", 0, 0, RANK_FAILURE) == Abstention(False, 0)
    before = _state(transport)
    header = pb.UpdateHeader(
        participant_id="alpha", round_index=0, attempt=0, payload_hash=bytes_hash(b"u")
    )
    early = transport.precheck(header)
    assert isinstance(early, Rejection)
    _refused(early, nerr.ABSTAINED, grpc.StatusCode.FAILED_PRECONDITION)
    late = transport.submit(Submission("alpha", 0, b"u", bytes_hash(b"u"), 0), 0, 1)
    assert isinstance(late, Rejection)
    _refused(late, nerr.ABSTAINED, grpc.StatusCode.FAILED_PRECONDITION)
    transport.upload_refused("alpha", 0, 0, Reason.BAD_PAYLOAD.value)  # a broken upload
    assert _state(transport) == before
    assert not transport._hand_over._inbox
    assert transport.absence_reasons() == {"alpha": "rank_failure"}


def test_a_presence_break_or_rejoin_after_abstaining_keeps_the_reason() -> None:
    transport = _joined()
    transport.open_round(_opening(), b"model")
    transport.abstain("alpha", 0, 0, RANK_FAILURE)
    transport.presence_closed("alpha", broken=True)
    assert transport.join("alpha", transport.config_hash, "{}", "x").already_submitted is False
    transport.leave("alpha", "bye")
    assert transport.absence_reasons() == {"alpha": "rank_failure"}


# ------------------------------------------------------------------- the gRPC handler
class _Aborted(Exception):
    pass


class _Context:
    """The parts of a gRPC servicer context the handler uses."""

    def __init__(self, caller: str) -> None:
        self.caller = caller
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self.trailing: dict[str, str] = {}

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((PARTICIPANT_KEY, self.caller),)

    def set_trailing_metadata(self, items: Any) -> None:
        self.trailing = dict(items)

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details
        raise _Aborted


def _service(transport: GrpcCoordinatorTransport) -> CoordinatorService:
    return CoordinatorService(transport, Authenticator(transport.config, IDS), 1 << 20)


def _call(service: CoordinatorService, caller: str, **fields: Any) -> _Context | pb.AbstainReply:
    request = {
        "participant_id": caller,
        "session": service.transport.session,
        "round_index": 0,
        "attempt": 0,
        "reason": RANK_FAILURE,
        **fields,
    }
    context = _Context(caller)
    try:
        return service.Abstain(pb.AbstainRequest(**request), context)
    except _Aborted:
        return context


def test_the_handler_answers_an_abstention() -> None:
    transport = _joined()
    transport.open_round(_opening(), b"model")
    service = _service(transport)
    assert _call(service, "alpha") == pb.AbstainReply(outcome="abstained", current_round=0)
    assert _call(service, "alpha") == pb.AbstainReply(outcome="duplicate", current_round=0)
    assert transport.absence_reasons() == {"alpha": "rank_failure"}


@pytest.mark.parametrize(
    ("fields", "reason", "status"),
    [
        ({"participant_id": "bravo"}, nerr.BAD_CREDENTIALS, grpc.StatusCode.PERMISSION_DENIED),
        ({"participant_id": "mallory"}, "unknown_participant", grpc.StatusCode.PERMISSION_DENIED),
        ({"session": "0" * 16}, nerr.STALE_SESSION, grpc.StatusCode.FAILED_PRECONDITION),
        ({"reason": "timeout"}, nerr.UNKNOWN_ABSTENTION, grpc.StatusCode.INVALID_ARGUMENT),
        ({"round_index": 7}, "closed_round", grpc.StatusCode.FAILED_PRECONDITION),
        *(
            ({name: "x" * (limit + 1)}, nerr.OVERSIZED, grpc.StatusCode.INVALID_ARGUMENT)
            for name, limit in sorted(ABSTAIN_LIMITS.items())
        ),
    ],
    ids=[
        "another-participant",
        "unknown-participant",
        "stale-session",
        "unknown-reason",
        "future-round",
        *(f"oversized-{name}" for name in sorted(ABSTAIN_LIMITS)),
    ],
)
def test_the_handler_refuses_hostile_requests_with_a_status_and_changes_nothing(
    fields: dict[str, Any], reason: str, status: grpc.StatusCode
) -> None:
    transport = _joined()
    transport.open_round(_opening(), b"model")
    service = _service(transport)
    before = _state(transport)
    context = _call(service, "alpha", **fields)
    assert isinstance(context, _Context)
    assert (context.code, context.trailing[nerr.REASON_KEY]) == (status, reason)
    assert context.trailing[nerr.CURRENT_ROUND_KEY] == "0"
    assert _state(transport) == before
    refused = transport.metrics.refused_calls.labels(rpc="Abstain", reason=reason)
    assert refused._value.get() == 1


# ------------------------------------------------------------------- the participant side
class _RpcError(grpc.RpcError):  # type: ignore[misc]
    def __init__(self, code: grpc.StatusCode, reason: str = "") -> None:
        self._code, self._reason = code, reason

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "refused."

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((nerr.REASON_KEY, self._reason),) if self._reason else ()


class _Client:
    """A ``CoordinatorClient`` whose Abstain calls answer from a script."""

    def __init__(self, answers: list[Any]) -> None:
        from lensemble.network.shared.metrics import Metrics

        self.id, self.target, self.metrics = "alpha", "127.0.0.1:1", Metrics()
        self.answers = answers
        self.calls: list[tuple[int, int, str]] = []

    def abstain(self, opening: RoundOpening, reason: str) -> pb.AbstainReply:
        self.calls.append((opening.round_index, opening.attempt, reason))
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[no-any-return]


def _loop(client: _Client) -> Any:
    from lensemble.network.participant.backoff import Backoff
    from lensemble.network.participant.loop import ParticipantLoop

    config = _config()
    learner = RankFailingLearner("alpha", config.run.root_seed)
    participant = Participant(config, "alpha", learner, manifest(initial_params(3)))
    return ParticipantLoop(config, participant, client, backoff=Backoff(0.01))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "answers",
    [
        [pb.AbstainReply(outcome="abstained")],
        [_RpcError(grpc.StatusCode.UNAVAILABLE), pb.AbstainReply(outcome="duplicate")],
        [_RpcError(grpc.StatusCode.UNIMPLEMENTED)],  # a coordinator that predates Abstain
        [_RpcError(grpc.StatusCode.FAILED_PRECONDITION, "closed_round")],
    ],
    ids=["recorded", "transient-then-duplicate", "old-coordinator", "round-closed"],
)
def test_the_participant_reports_a_lost_round_and_never_fails_on_the_answer(
    answers: list[Any],
) -> None:
    client = _Client(list(answers))
    loop = _loop(client)
    loop._abstain(_opening(2, 1), RANK_FAILURE)
    assert client.calls == [(2, 1, "rank_failure")] * len(answers)
    assert client.answers == []
