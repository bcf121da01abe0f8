"""The round state machine, quorum, elastic completion, abort/retry, late and bad submissions."""

from __future__ import annotations

import pytest
import torch

from lensemble.errors import QuorumNotReached, RoundError
from lensemble.federation.diloco import OuterStep, canonical_mean, pseudo_gradient, zeros_like
from lensemble.federation.faults import parse_faults
from lensemble.federation.ledger import committed_chain
from lensemble.federation.messages import Reason, Submission
from lensemble.federation.payload import bytes_hash, encode, model_hash
from lensemble.federation.rounds import RoundMachine, RoundState
from tests.support.federation import QuadraticLearner, build, initial_params, small_config


def test_state_machine_allows_only_forward_edges_and_abort() -> None:
    m = RoundMachine(0, 0)
    for state in (
        RoundState.COLLECTING,
        RoundState.AGGREGATING,
        RoundState.COMMITTING,
        RoundState.CLOSED,
    ):
        m.advance(state)
    assert m.done
    with pytest.raises(RoundError, match="cannot go from closed"):
        m.advance(RoundState.ABORTED)
    for stop in (
        RoundState.OPEN,
        RoundState.COLLECTING,
        RoundState.AGGREGATING,
        RoundState.COMMITTING,
    ):
        m = RoundMachine(1, 0)
        while m.state != stop:
            m.advance(
                {
                    RoundState.OPEN: RoundState.COLLECTING,
                    RoundState.COLLECTING: RoundState.AGGREGATING,
                    RoundState.AGGREGATING: RoundState.COMMITTING,
                }[m.state]
            )
        m.advance(RoundState.ABORTED)
        assert m.history[-1] == RoundState.ABORTED
    with pytest.raises(RoundError):
        RoundMachine(2, 0).advance(RoundState.COMMITTING)


def test_full_run_commits_every_round_with_every_participant() -> None:
    config = small_config()
    coordinator, transport, _ = build(config)
    first_model_payload = coordinator.model_payload()
    summary = coordinator.run(transport)
    assert summary.version == 3
    assert [r.state for r in summary.records] == ["closed"] * 3
    assert all(r.contributors == ["alpha", "bravo", "charlie", "delta"] for r in summary.records)
    chain = committed_chain(summary.records)
    assert chain[-1] == summary.model_hash
    assert summary.records[0].parent_hash == model_hash(initial_params(3), 0, "")
    # The transport's exact byte counts are what the ledger records.
    assert summary.records[0].bytes_up == sum(d.size for d in transport.delivered[:4])
    assert summary.records[0].bytes_down == 4 * len(first_model_payload)


def test_first_round_equals_manual_diloco_step() -> None:
    config = small_config(rounds=1)
    coordinator, transport, _ = build(config)
    theta0 = initial_params(3)
    coordinator.run(transport)
    deltas = {}
    for pid in config.participant_ids:
        local = QuadraticLearner(pid, 3).train_round(theta0, 0, config.federation.inner_steps)
        deltas[pid] = pseudo_gradient(theta0, local.params)
    step = OuterStep(0.7, 0.9, True)
    expected, _ = step.apply(theta0, canonical_mean(deltas), zeros_like(theta0))
    assert all(torch.equal(coordinator.params[k], expected[k]) for k in expected)


def test_elastic_completion_with_quorum_divides_by_contributors() -> None:
    config = small_config(rounds=1)
    coordinator, transport, _ = build(config, faults=parse_faults("drop:charlie@0"))
    (record,) = coordinator.run(transport).records
    assert record.contributors == ["alpha", "bravo", "delta"]
    assert record.excluded == {"charlie": "timeout"}
    theta0 = initial_params(3)
    deltas = {
        pid: pseudo_gradient(theta0, QuadraticLearner(pid, 3).train_round(theta0, 0, 2).params)
        for pid in ("alpha", "bravo", "delta")
    }
    expected, _ = OuterStep(0.7, 0.9, True).apply(
        theta0, canonical_mean(deltas), zeros_like(theta0)
    )
    assert all(torch.equal(coordinator.params[k], expected[k]) for k in expected)
    # The timeout cost no wall time: the virtual clock jumped to the deadline.
    assert transport.now() >= config.federation.round_timeout_s


def test_round_below_quorum_aborts_unchanged_and_is_retried() -> None:
    config = small_config(rounds=2)
    coordinator, transport, _ = build(config, faults=parse_faults("drop:alpha@1.0,drop:bravo@1.0"))
    summary = coordinator.run(transport)
    states = [(r.round, r.attempt, r.state) for r in summary.records]
    assert states == [(0, 0, "closed"), (1, 0, "aborted"), (1, 1, "closed")]
    aborted = summary.records[1]
    assert aborted.model_hash == aborted.parent_hash == summary.records[0].model_hash
    assert aborted.excluded == {"alpha": "timeout", "bravo": "timeout"}
    assert summary.records[2].parent_hash == summary.records[0].model_hash


def test_run_stops_with_clear_error_when_retries_are_exhausted() -> None:
    config = small_config(rounds=3, max_round_retries=2)
    coordinator, transport, _ = build(config, faults=parse_faults("drop:alpha@1,drop:bravo@1"))
    with pytest.raises(QuorumNotReached, match="round 1 reached only 2 of 3") as info:
        coordinator.run(transport)
    assert "lower federation.quorum" in str(info.value)
    assert coordinator.version == 1  # round 0 committed, round 1 never did
    assert [r.state for r in coordinator.records] == ["closed", "aborted", "aborted", "aborted"]


def test_late_submission_is_rejected_in_a_later_round() -> None:
    config = small_config(rounds=3)
    coordinator, transport, _ = build(config, faults=parse_faults("delay:delta@0"))
    summary = coordinator.run(transport)
    assert summary.records[0].excluded == {"delta": "timeout"}
    late = [(s, v) for s, v in transport.replies if s.round_index == 0 and s.sender == "delta"]
    assert len(late) == 1
    assert late[0][1].reason == Reason.CLOSED_ROUND
    assert late[0][1].current_round == 1
    assert summary.records[1].contributors == ["alpha", "bravo", "charlie", "delta"]


def test_an_aborted_attempts_late_updates_are_refused_in_the_retry(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Issue 15, item 1: round 1's attempt-0 updates of three participants arrive after its
    # deadline, during attempt 1 (same round, same base model). They are refused there, as the
    # network transport refuses them; the retry is delayed too, so the run stops below quorum.
    config = small_config(rounds=2, max_round_retries=1)
    faults = parse_faults("delay:alpha@1,delay:charlie@1,delay:delta@1")
    coordinator, transport, _ = build(config, faults=faults, output_dir=tmp_path)
    with pytest.raises(QuorumNotReached, match="round 1 reached only 1 of 3"):
        coordinator.run(transport)
    stale = [
        verdict.reason
        for sent, verdict in transport.replies
        if (sent.round_index, sent.attempt) == (1, 0) and sent.sender != "bravo"
    ]
    assert stale == [Reason.CLOSED_ROUND] * 3
    retry = coordinator.records[-1]
    assert (retry.round, retry.attempt, retry.contributors) == (1, 1, ["bravo"])
    # Refused for another attempt is not a reason to be excluded from this one: they timed out.
    assert retry.excluded == {"alpha": "timeout", "charlie": "timeout", "delta": "timeout"}


def test_a_late_update_counts_as_absence_so_the_chain_is_a_drops(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # The late update is refused and forgotten before its sender trains the retry, as over the
    # network: the chain is the one of a run where they were simply absent from that attempt.
    config = small_config(rounds=3)
    late, late_transport, _ = build(
        config, faults=parse_faults("delay:alpha@1.0,delay:charlie@1.0"), output_dir=tmp_path / "a"
    )
    dropped, drop_transport, _ = build(
        config, faults=parse_faults("drop:alpha@1.0,drop:charlie@1.0"), output_dir=tmp_path / "b"
    )
    late_records, drop_records = (
        late.run(late_transport).records,
        dropped.run(drop_transport).records,
    )
    assert [(r.round, r.attempt, r.contributors) for r in late_records] == [
        (0, 0, ["alpha", "bravo", "charlie", "delta"]),
        (1, 0, ["bravo", "delta"]),
        (1, 1, ["alpha", "bravo", "charlie", "delta"]),
        (2, 0, ["alpha", "bravo", "charlie", "delta"]),
    ]
    assert committed_chain(late_records) == committed_chain(drop_records)


def test_a_resend_of_an_update_counted_in_the_closed_attempt_is_a_duplicate() -> None:
    d = _Direct()
    c = d.coordinator
    assert d.submit(d.good.payload) == Reason.ACCEPTED
    c.admission.close()  # the attempt closed with alpha's update counted
    assert d.submit(d.good.payload) == Reason.DUPLICATE
    assert d.submit(d.good.payload, attempt=1) == Reason.CLOSED_ROUND
    assert d.submit(d.good.payload, sender="bravo") == Reason.CLOSED_ROUND


def test_duplicates_are_accepted_once_and_do_not_change_the_hash() -> None:
    clean_coord, clean_transport, _ = build(small_config())
    clean = clean_coord.run(clean_transport)
    coordinator, transport, _ = build(small_config(), faults=parse_faults("duplicate:bravo@1"))
    summary = coordinator.run(transport)
    assert summary.model_hash == clean.model_hash
    reasons = [v.reason for s, v in transport.replies if s.sender == "bravo" and s.round_index == 1]
    assert reasons == [Reason.ACCEPTED, Reason.DUPLICATE]


def test_corrupt_submission_is_excluded_with_its_reason() -> None:
    coordinator, transport, _ = build(
        small_config(rounds=1), faults=parse_faults("corrupt:alpha@0")
    )
    (record,) = coordinator.run(transport).records
    assert record.excluded == {"alpha": "hash_mismatch"}
    assert coordinator.admission.rejections["hash_mismatch"] == 1


class _Direct:
    """Drive Coordinator.accept directly inside an open round."""

    def __init__(self) -> None:
        self.config = small_config(rounds=1)
        self.coordinator, self.transport, self.participants = build(self.config)
        from lensemble.federation.messages import RoundOpening

        c = self.coordinator
        self.opening = RoundOpening(0, 0, 0, c.model_hash, 30.0)
        c.admission.open(self.opening)
        self.good = self.participants["alpha"].contribute(self.opening, c.model_payload())

    def submit(
        self,
        payload: bytes,
        sender: str = "alpha",
        round_index: int = 0,
        declared: str | None = None,
        attempt: int = 0,
    ) -> Reason:
        sub = Submission(sender, round_index, payload, declared or bytes_hash(payload), attempt)
        return self.coordinator.accept(sub).reason


def _forged(direct: _Direct, tensors: dict[str, torch.Tensor], **meta: str) -> bytes:
    metadata = {
        "kind": "pseudo-gradient",
        "round": "0",
        "attempt": "0",
        "participant": "alpha",
        "base_hash": direct.opening.model_hash,
        "quantization": "none",
        "int8_chunk": "0",
        "mean_loss": "1.0",
    }
    metadata.update(meta)
    return encode(tensors, metadata)


def test_bad_submissions_are_rejected_by_reason_and_the_coordinator_keeps_going() -> None:
    d = _Direct()
    zeros = {k: torch.zeros_like(v) for k, v in initial_params().items()}
    assert d.submit(d.good.payload, sender="mallory") == Reason.UNKNOWN_PARTICIPANT
    assert d.submit(d.good.payload, round_index=5) == Reason.CLOSED_ROUND
    assert d.submit(d.good.payload, attempt=1) == Reason.CLOSED_ROUND
    assert d.submit(d.good.payload, declared="sha256:" + "0" * 64) == Reason.HASH_MISMATCH
    assert d.submit(b"\x08\x00\x00\x00\x00\x00\x00\x00{notjson") == Reason.BAD_PAYLOAD
    assert d.submit(b"\xff" * 16) == Reason.BAD_PAYLOAD
    wrong_shape = dict(zeros)
    wrong_shape["encoder.bias"] = torch.zeros(4)
    assert d.submit(_forged(d, wrong_shape)) == Reason.ARCHITECTURE_MISMATCH
    nan = dict(zeros)
    nan["encoder.bias"] = torch.tensor([0.0, float("nan"), 0.0])
    assert d.submit(_forged(d, nan)) == Reason.NON_FINITE
    assert d.submit(_forged(d, zeros, base_hash="sha256:" + "1" * 64)) == Reason.STALE_BASE
    assert d.submit(_forged(d, zeros, participant="bravo")) == Reason.BAD_PAYLOAD
    assert d.submit(_forged(d, zeros, quantization="int8")) == Reason.BAD_PAYLOAD
    assert d.submit(_forged(d, zeros, attempt="1")) == Reason.CLOSED_ROUND  # header says 0
    # A good one is still accepted afterwards; a resend is idempotent; other bytes conflict.
    assert d.submit(d.good.payload) == Reason.ACCEPTED
    assert d.submit(d.good.payload) == Reason.DUPLICATE
    assert d.submit(_forged(d, zeros)) == Reason.CONFLICTING_DUPLICATE
    assert sum(d.coordinator.admission.rejections.values()) == 13


def test_a_finished_run_resumed_ends_without_waiting_for_participants(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = small_config(rounds=1)
    coordinator, transport, _ = build(config, output_dir=tmp_path)
    coordinator.run(transport)
    resumed, transport2, _ = build(config, output_dir=tmp_path, resume=True)

    def never(quorum: int, timeout_s: float) -> set[str]:
        raise AssertionError("a finished run must not wait for participants")

    transport2.wait_for_participants = never  # type: ignore[method-assign]
    summary = resumed.run(transport2)
    assert summary.version == 1 and summary.records == [] and transport2.finished
