"""federation.overlap one_round: the base each round trains from, on every path to it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from lensemble.errors import OverlapBaseMissing
from lensemble.federation.faults import parse_faults
from lensemble.federation.ledger import committed_chain
from lensemble.federation.messages import NO_BASE_MODEL, RoundOpening
from lensemble.federation.overlap import OverlapState, round_base_hash
from lensemble.federation.payload import decode
from tests.support.federation import build, small_config

ONE_ROUND = {"mode": "one_round", "local_weight": 0.75}
#: The outer optimizer of the test configs without momentum (one_round refuses any).
NO_MOMENTUM = {"lr": 0.7, "momentum": 0.0, "nesterov": True}


def _run(faults: str = "", **federation: Any) -> tuple[list[str], list[Any]]:
    coordinator, transport, _ = build(small_config(**federation), faults=parse_faults(faults))
    records = coordinator.run(transport).records
    return committed_chain(records), records


def _opening(round_index: int, model: str, base: str = "", attempt: int = 0) -> RoundOpening:
    return RoundOpening(round_index, attempt, round_index, model, 0.0, base_hash=base)


def test_rounds_after_the_first_train_from_the_model_one_round_older() -> None:
    coordinator, transport, participants = build(
        small_config(overlap=ONE_ROUND, outer_optimizer=NO_MOMENTUM)
    )
    seen: list[tuple[str, str]] = []
    contribute = participants["alpha"].contribute

    def spy(opening: RoundOpening, payload: bytes, **kw: Any) -> Any:
        out = contribute(opening, payload, **kw)
        seen.append((opening.model_hash, decode(out.payload).metadata["base_hash"]))
        return out

    participants["alpha"].contribute = spy  # type: ignore[method-assign]
    records = coordinator.run(transport).records
    chain = committed_chain(records)
    # Round 0 trains from the initial model; round t from the model round t - 1 announced.
    assert seen[0] == (records[0].parent_hash, records[0].parent_hash)
    for t in (1, 2):
        assert seen[t] == (chain[t - 1], records[t - 1].parent_hash)
        assert seen[t][1] != seen[t][0]


def test_one_round_is_deterministic_and_differs_from_blocking() -> None:
    overlapped = _run(overlap=ONE_ROUND, outer_optimizer=NO_MOMENTUM)[0]
    assert overlapped == _run(overlap=ONE_ROUND, outer_optimizer=NO_MOMENTUM)[0]
    assert overlapped != _run(outer_optimizer=NO_MOMENTUM)[0]
    # The local weight is part of the maths: another weight, another chain.
    assert (
        overlapped
        != _run(overlap={**ONE_ROUND, "local_weight": 0.0}, outer_optimizer=NO_MOMENTUM)[0]
    )


def test_a_participant_that_missed_the_previous_round_sits_the_next_out_then_trains() -> None:
    # bravo sends nothing in round 0, so it never received the model round 1 trains from.
    chain, records = _run("drop:bravo@0", overlap=ONE_ROUND, outer_optimizer=NO_MOMENTUM)
    by_round = {r.round: r for r in records if r.state == "closed"}
    assert "bravo" not in by_round[0].contributors
    assert by_round[1].excluded.get("bravo") == NO_BASE_MODEL
    assert "bravo" in by_round[2].contributors
    assert len(chain) == 3


def test_base_hash_follows_the_last_outer_step_and_never_a_rolled_back_model() -> None:
    blocking, overlapped = (
        small_config(),
        small_config(overlap=ONE_ROUND, outer_optimizer=NO_MOMENTUM),
    )
    _, records = _run(overlap=ONE_ROUND, outer_optimizer=NO_MOMENTUM)
    current = records[-1].model_hash
    assert round_base_hash(blocking, records, current, 0) == ""
    assert round_base_hash(overlapped, records, current, 0) == records[-1].parent_hash
    # A coordinator's first round (a resumed one's too) and a retried attempt train from the
    # announced model: whoever lacked the base holds that one.
    assert round_base_hash(overlapped, [], current, 0) == ""
    assert round_base_hash(overlapped, records, current, 1) == ""
    # An aborted attempt after the commit changes nothing; a model the history did not make
    # (a rollback's restored one) is trained from directly.
    aborted = records[-1].__class__(
        **{**records[-1].__dict__, "state": "aborted", "parent_hash": current}
    )
    assert round_base_hash(overlapped, [*records, aborted], current, 0) == records[-1].parent_hash
    assert round_base_hash(overlapped, records, "sha256:" + "0" * 64, 0) == ""
    rolled_back = records[-1].__class__(**{**records[-1].__dict__, "guard": {"action": "rollback"}})
    assert round_base_hash(overlapped, [*records[:-1], rolled_back], current, 0) == ""


def test_a_round_nobody_holds_the_base_of_commits_on_its_retry(tmp_path: Path) -> None:
    # A resumed run: its participants are new processes holding no model. The resumed
    # coordinator's first round trains from its own model, so nobody sits out.
    config = small_config(overlap=ONE_ROUND, outer_optimizer=NO_MOMENTUM, rounds=2)
    coordinator, transport, _ = build(config, output_dir=tmp_path)
    coordinator.run(transport)
    longer = small_config(overlap=ONE_ROUND, outer_optimizer=NO_MOMENTUM, rounds=4)
    resumed, transport, _ = build(longer, output_dir=tmp_path, resume=True)
    records = resumed.run(transport).records
    assert [(r.round, r.attempt, r.state) for r in records] == [(2, 0, "closed"), (3, 0, "closed")]
    assert all(r.excluded == {} for r in records)
    # Round 1's first attempt: three lack its base (they sent nothing in round 0), the fourth
    # drops. The retry trains from the announced model, which all of them now hold.
    _, records = _run(
        "drop:alpha@0,drop:bravo@0,drop:charlie@0,drop:delta@1.0",
        overlap=ONE_ROUND,
        outer_optimizer=NO_MOMENTUM,
        quorum=1,
    )
    by_attempt = {(r.round, r.attempt): r for r in records}
    assert by_attempt[(1, 0)].state == "aborted"
    assert {by_attempt[(1, 0)].excluded[p] for p in ("alpha", "bravo", "charlie")} == {
        NO_BASE_MODEL
    }
    assert by_attempt[(1, 1)].state == "closed" and by_attempt[(1, 1)].excluded == {}


def test_overlap_state_base_is_the_held_model_minus_the_weighted_own_progress() -> None:
    state = OverlapState(small_config(overlap=ONE_ROUND, outer_optimizer=NO_MOMENTUM))
    g0 = {"w": torch.tensor([1.0, 2.0])}
    g1 = {"w": torch.tensor([3.0, 5.0])}
    state.hold(_opening(0, "h0"), g0)
    assert state.base(_opening(0, "h0"), g0) is g0  # blocking round: the announced model
    state.keep_own(_opening(0, "h0"), {"w": torch.tensor([4.0, -4.0])})
    state.hold(_opening(1, "h1", base="h0"), g1)
    assert torch.equal(state.base(_opening(1, "h1", base="h0"), g1)["w"], torch.tensor([-2.0, 5.0]))
    # A retry of round 1 still finds its base; the update of round 0 forgotten, the base is
    # the held model alone.
    state.forget(0, 0)
    assert torch.equal(state.base(_opening(1, "h1", base="h0", attempt=1), g1)["w"], g0["w"])
    with pytest.raises(OverlapBaseMissing, match="did not receive"):
        state.base(_opening(2, "h2", base="elsewhere"), g1)


def test_training_ahead_gives_the_same_update_as_training_after_the_announcement(
    tmp_path: Path,
) -> None:
    def updates(ahead: bool, discard: bool = False) -> tuple[list[Any], list[int]]:
        out = tmp_path / f"run-{ahead}-{discard}"
        coordinator, transport, participants = build(
            small_config(overlap=ONE_ROUND, outer_optimizer=NO_MOMENTUM), output_dir=out
        )
        alpha = participants["alpha"]
        sent: list[Any] = []
        trained: list[int] = []
        contribute, train_round = alpha.contribute, alpha.learner.train_round

        def count(params: Any, round_index: int, steps: int) -> Any:
            trained.append(round_index)
            return train_round(params, round_index, steps)

        def spy(opening: RoundOpening, payload: bytes, **kw: Any) -> Any:
            result = contribute(opening, payload, **kw)
            # The tensors and the base, not the bytes: the metadata carries timings.
            decoded = decode(result.payload)
            sent.append(
                (
                    decoded.metadata["base_hash"],
                    [decoded.tensors[k] for k in sorted(decoded.tensors)],
                )
            )
            if ahead:  # what the network participant does while the update travels
                # Nothing is trained ahead of the last round's successor.
                assert alpha.train_ahead(opening) == (opening.round_index < 2)
                if discard and alpha._ahead is not None:  # as if the next one named another base
                    alpha._ahead = dataclasses.replace(alpha._ahead, base_hash="sha256:other")
            return result

        alpha.learner.train_round = count  # type: ignore[method-assign]
        alpha.contribute = spy  # type: ignore[method-assign]
        coordinator.run(transport)
        return sent, trained

    def same(a: list[Any], b: list[Any]) -> bool:
        return len(a) == len(b) and all(
            x[0] == y[0] and all(torch.equal(u, v) for u, v in zip(x[1], y[1], strict=True))
            for x, y in zip(a, b, strict=True)
        )

    reference, trained = updates(ahead=False)
    assert len(reference) == 3 and trained == [0, 1, 2]
    # Rounds 1 and 2 are trained ahead and taken as they are.
    ahead, trained = updates(ahead=True)
    assert same(ahead, reference) and trained == [0, 1, 2]
    # Discarded: the inner state goes back and the round is trained again, to the same bits.
    retrained, trained = updates(ahead=True, discard=True)
    assert same(retrained, reference) and trained == [0, 1, 1, 2, 2]


def test_overlap_is_refused_with_masking_naming_the_field() -> None:
    from lensemble.config.load import validate_mapping
    from lensemble.errors import ConfigError

    with pytest.raises(ConfigError, match="federation.overlap.mode"):
        validate_mapping(
            {
                "federation": {
                    "participant_count": 4,
                    "aggregation": "masking",
                    "overlap": {"mode": "one_round"},
                }
            }
        )


def test_the_ledger_names_each_rounds_base_and_verification_replays_it() -> None:
    from lensemble.federation.verify_history import HistoryReplay

    _, records = _run(
        "scaled:delta@2-=-20,alie:charlie@0-",
        overlap=ONE_ROUND,
        outer_optimizer=NO_MOMENTUM,
        rounds=7,
        robustness={"median_factor": 10, "max_relative_change": 1e6},
    )
    assert [r.defences.get("trained_from") for r in records[:2]] == [None, records[0].parent_hash]
    # The round after a rollback trains from the restored model, its parent.
    rollbacks = [i for i, r in enumerate(records) if r.guard.get("action") == "rollback"]
    assert rollbacks and rollbacks[0] + 1 < len(records)
    assert "trained_from" not in records[rollbacks[0] + 1].defences
    replay = HistoryReplay()
    assert [replay.check(r) for r in records] == [None] * len(records)
    # A line claiming another base is a break, named.
    forged = dataclasses.replace(
        records[2], defences={**records[2].defences, "trained_from": records[2].parent_hash}
    )
    replay = HistoryReplay()
    problems = [replay.check(r) for r in [*records[:2], forged]]
    assert problems[:2] == [None, None] and "trained from" in str(problems[2])
