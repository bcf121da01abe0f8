"""Masked rounds with several groups draw each attempt's groups from who is present (issue 37).

Nine participants in groups of 3 (quorum 5): a group of exactly 3 aborts on one drop-out, so
groups drawn from every configured participant could not commit once two absent ones fell in
different groups. The attempt's present set (lensemble.federation.secagg.present) leaves them
out; a hostile coordinator's announcement is checked by every participant and bound into the
session digest.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lensemble.config.load import validate_mapping
from lensemble.federation.central_privacy import fewest_summed
from lensemble.federation.faults import parse_faults
from lensemble.federation.masked_round import ABSENT, LEFT_OUT, present_now
from lensemble.federation.masking import SessionKey, session_contexts
from lensemble.federation.masking_client import MaskingClient
from lensemble.federation.payload import manifest
from lensemble.federation.secagg.driver import drive
from lensemble.federation.secagg.errors import Reason, SecAggAbort
from lensemble.federation.secagg.groups import assign_groups
from lensemble.federation.secagg.identity import simulation_identity
from lensemble.federation.secagg.keys import simulation_seed
from lensemble.federation.secagg.present import PresentSet
from lensemble.federation.secagg.server import ServerSession
from lensemble.federation.verify import verify_run
from tests.federation.secagg.helpers import context
from tests.support.federation import build, initial_params, small_federation

NINE = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india")
SEED = 3


def _config(ids: tuple[str, ...] = NINE, **federation: Any) -> Any:
    settings = {"masking": {"clip": 10.0, "group_size": 3}, "quorum": 5, **federation}
    fed = small_federation(
        participants=[{"id": pid} for pid in ids], aggregation="masking", **settings
    )
    return validate_mapping(
        {"federation": fed, "network": {"rpc_timeout_s": 5}, "run": {"root_seed": SEED}}
    )


def _run(faults: str, output_dir: Path | None = None, **federation: Any) -> Any:
    config = _config(**federation)
    coordinator, transport, _ = build(config, faults=parse_faults(faults), output_dir=output_dir)
    return coordinator.run(transport)


def _split(round_index: int) -> tuple[str, str]:
    """Two participants in different groups of ``round_index`` (drawn from all nine)."""
    groups = assign_groups(NINE, 3, SEED, round_index).groups
    return groups[0][0], groups[1][0]


def _chain(records: Any) -> list[str]:
    return [r.model_hash for r in records if r.state == "closed"]


def test_two_participants_absent_from_the_start_leave_every_round_to_the_seven(
    tmp_path: Path,
) -> None:
    gone = _split(0)
    # Drawn from all nine, the absent two fall in different groups of round 0: two groups
    # of 3 would abort and 3 contributors stay below the quorum of 5 (QuorumNotReached).
    faults = ",".join(f"drop:{pid}@0-" for pid in gone)
    summary = _run(faults, output_dir=tmp_path)
    assert [(r.round, r.attempt, r.state) for r in summary.records] == [
        (t, 0, "closed") for t in range(3)
    ]
    here = sorted(set(NINE) - set(gone))
    for record in summary.records:
        masking = record.defences["masking"]
        assert masking["present"] == here
        assert sorted(record.contributors) == here
        assert record.excluded == dict.fromkeys(sorted(gone), ABSENT)
        grouped = [p for g in masking["groups"] for p in g["roster"]]
        assert sorted(grouped) == here and all(len(g["roster"]) >= 3 for g in masking["groups"])
    assert verify_run(tmp_path).ok
    assert _chain(_run(faults).records) == _chain(summary.records)


def test_drop_outs_mid_session_in_two_groups_commit_on_a_retry_regrouped(tmp_path: Path) -> None:
    silent = _split(1)
    faults = ",".join(f"delay:{pid}@1" for pid in silent)  # silent from the masked upload on
    summary = _run(faults, output_dir=tmp_path)
    first, retry = (r for r in summary.records if r.round == 1)
    # Attempt 0: both their groups abort at the masked upload; the third group's 3 survivors
    # are below quorum, so it is abandoned before anyone signs (no update is unmasked, and
    # every one of the seven may mask again in the retry).
    assert first.state == "aborted" and first.attempt == 0
    groups = first.defences["masking"]["groups"]
    assert [g["aborted"] for g in groups if g["aborted"] != "below_quorum"] == [
        "below_threshold"
    ] * 2
    assert sum(g["aborted"] == "below_quorum" for g in groups) == 1
    assert all("signed" not in g for g in groups)
    assert all(g["stage"] in ("mask", "consistency") for g in groups)
    assert "present" not in first.defences["masking"]  # everyone was there at its start
    assert first.excluded[silent[0]] == "masking_aborted:below_threshold"
    # The retry regroups the seven that did not drop out, and says why the two are out.
    assert retry.state == "closed" and retry.attempt == 1
    here = sorted(set(NINE) - set(silent))
    assert retry.defences["masking"]["present"] == here == sorted(retry.contributors)
    assert retry.excluded == dict.fromkeys(sorted(silent), LEFT_OUT)
    assert all(r.state == "closed" for r in summary.records if r.round != 1)
    assert verify_run(tmp_path).ok
    assert _chain(_run(faults).records) == _chain(summary.records)


def test_a_clean_nine_draws_every_group_from_all_as_before() -> None:
    summary = _run("")
    for record in summary.records:
        masking = record.defences["masking"]
        assert "present" not in masking
        drawn = [tuple(g["roster"]) for g in masking["groups"]]
        assert drawn == list(assign_groups(NINE, 3, SEED, record.round).groups)


def test_the_present_set_leaves_out_earlier_drop_outs_only_while_enough_remain() -> None:
    config = _config()
    here, out = present_now(config, set(NINE) - {"alpha"}, {}, {"bravo", "charlie"})
    assert here == tuple(sorted(set(NINE) - {"alpha", "bravo", "charlie"}))
    assert out == {"alpha": ABSENT, "bravo": LEFT_OUT, "charlie": LEFT_OUT}
    # Leaving five earlier drop-outs out would leave 4, below the quorum of 5: they stay.
    here, out = present_now(config, set(NINE), {}, set(NINE[:5]))
    assert here == NINE and out == {}
    # Without the transport's word, everyone but those it knows absent.
    here, out = present_now(config, None, {"golf": "left"}, set())
    assert "golf" not in here and out == {"golf": ABSENT}


# ------------------------------------------------------------------ a hostile coordinator
def _clients(config: Any, round_index: int = 0, attempt: int = 0) -> dict[str, MaskingClient]:
    arch = manifest(initial_params(SEED))
    keys = {pid: simulation_identity(SEED, pid) for pid in config.participant_ids}
    verifiers = {pid: key.public_key() for pid, key in keys.items()}
    d = sum(int(np.prod(spec.shape)) for spec in arch.values())
    clients = {}
    for pid in config.participant_ids:
        client = MaskingClient(
            config,
            pid,
            seed=simulation_seed(SEED, pid),
            identity_key=keys[pid],
            verifiers=verifiers,
            architecture=arch,
        )
        client.hold(round_index, attempt, np.full(d, 0.5, dtype=np.float32))
        clients[pid] = client
    return clients


def _group_of(config: Any, me: str, present: tuple[str, ...]) -> int:
    arch = manifest(initial_params(SEED))
    contexts = session_contexts(config, 0, 0, arch, present)
    return next(c.group for c in contexts if me in c)


@pytest.mark.parametrize(
    ("announced", "why"),
    [
        (("alpha", "bravo", "charlie", "delta", "mallory"), "not configured participants"),
        (("bravo", "charlie", "delta", "echo", "foxtrot"), "leaves alpha out"),
        (("alpha", "bravo", "charlie", "delta"), "fewer than the 5 needed"),
    ],
)
def test_a_participant_refuses_a_present_set_that_fails_a_check(
    announced: tuple[str, ...], why: str
) -> None:
    config = _config()
    alpha = _clients(config)["alpha"]
    answer = alpha.answer(SessionKey(0, 0, 0), "advertise", PresentSet(announced).encode())
    assert answer is None
    refusal = alpha.refusals[-1]
    assert refusal.reason is Reason.PRESENT_SET_REFUSED and why in str(refusal)


def test_a_malformed_present_set_is_refused_as_a_bad_message() -> None:
    alpha = _clients(_config())["alpha"]
    good = PresentSet(NINE[:6]).encode()
    unsorted = PresentSet(("bravo", "alpha", "charlie", "delta", "echo")).encode()
    for data in (good[:-3], good + b"x", unsorted, b"LSA\x01\x0a\xff\xff\xff\xff"):
        assert alpha.answer(SessionKey(0, 0, 0), "advertise", data) is None
        assert alpha.refusals[-1].reason is Reason.BAD_MESSAGE
    assert alpha.answer(
        SessionKey(0, 0, _group_of(_config(), "alpha", NINE[:6])), "advertise", good
    )


def test_one_group_takes_no_present_set() -> None:
    config = _config(ids=NINE[:5])  # 5 // 3 = 1 group: every configured participant's roster
    alpha = _clients(config)["alpha"]
    assert alpha.answer(SessionKey(0, 0, 0), "advertise", PresentSet(NINE[:5]).encode()) is None
    assert alpha.refusals[-1].reason is Reason.PRESENT_SET_REFUSED
    assert alpha.answer(SessionKey(0, 0, 0), "advertise", b"") is not None


def test_a_participant_masks_in_one_session_per_attempt_whatever_is_announced() -> None:
    config = _config()
    alpha = _clients(config)["alpha"]
    full = _group_of(config, "alpha", NINE)
    assert alpha.answer(SessionKey(0, 0, full), "advertise", b"") is not None
    # Another present set that puts alpha in another group (or the same): no second session.
    for dropped in NINE[1:]:
        present = tuple(p for p in NINE if p != dropped)
        group = _group_of(config, "alpha", present)
        data = PresentSet(present).encode()
        assert alpha.answer(SessionKey(0, 0, group), "advertise", data) is None
    assert not alpha.refusals  # nothing was wrong with the sets: alpha simply answers once


def test_different_present_sets_for_different_participants_are_caught_by_the_digest() -> None:
    config = _config()
    arch = manifest(initial_params(SEED))
    told = tuple(p for p in NINE if p != "india")
    # A member of a group under ``told`` that another present set puts in the same group index.
    found = [
        (ctx, member, other)
        for ctx in session_contexts(config, 0, 0, arch, told)
        for other in (NINE, *(tuple(p for p in told if p != q) for q in told))
        for member in ctx.roster
        if member in session_contexts(config, 0, 0, arch, other)[ctx.group] and len(other) >= 5
    ]
    assert found, "the seed gives no such member; pick another victim"
    ctx, victim, other = found[0]
    announced = PresentSet(other).encode() if other != NINE else b""
    clients = _clients(config)
    key = SessionKey(0, 0, ctx.group)
    server = ServerSession(ctx, {p: c.identity_key.public_key() for p, c in clients.items()})

    def exchange(stage: str, outgoing: dict[str, bytes]) -> Any:
        for pid, data in sorted(outgoing.items()):
            # The coordinator tells the victim another present set than the others.
            sent = announced if pid == victim and stage == "advertise" else data
            answer = clients[pid].answer(key, stage, sent)
            if answer is not None:
                yield pid, answer

    try:
        summed = drive(server, exchange).survivors
    except SecAggAbort:
        summed = ()  # too few left without the victim
    assert victim not in summed
    assert (victim, Reason.WRONG_SESSION) in {(r.participant, r.reason) for r in server.refusals}


def test_central_privacy_sizes_the_shares_by_the_sessions_groups() -> None:
    ten = (*NINE, "juliet")
    config = _config(ids=ten, masking={"clip": 10.0, "group_size": 4})
    arch = manifest(initial_params(SEED))
    for present in (None, ten[:8], ten[:9]):
        contexts = session_contexts(config, 2, 0, arch, present)
        fewest = min(max(3, c.threshold) for c in contexts)
        assert fewest_summed(config, 2, present) == fewest
    # Drawn from 8, the groups are of 4 (t = 3); from all ten, of 5 (t = 4).
    assert fewest_summed(config, 2, ten[:8]) < fewest_summed(config, 2)


def test_the_present_set_is_bound_into_the_digest_only_when_there_is_one() -> None:
    base = context(3, 8)
    present = (*base.roster, "zulu")
    bound = dataclasses.replace(base, present=present)
    assert bound.digest != base.digest
    assert dataclasses.replace(base, present=(*base.roster, "yankee")).digest != bound.digest
    assert dataclasses.replace(bound, present=()).digest == base.digest
    with pytest.raises(ValueError, match="drawn from the present set"):
        dataclasses.replace(base, present=base.roster[1:])
    with pytest.raises(ValueError, match="sorted"):
        dataclasses.replace(base, present=tuple(reversed(present)))


def test_a_retry_reuses_each_participants_training_of_the_round() -> None:
    # Attempt 0 of round 1 aborts (two groups lose a member); its retry trains from the same
    # model, so each participant sends the update it trained for attempt 0: no inner step twice.
    silent = _split(1)
    config = _config()
    plan = parse_faults(",".join(f"delay:{pid}@1" for pid in silent))
    coordinator, transport, participants = build(config, faults=plan)
    records = coordinator.run(transport).records
    first, retry = (r for r in records if r.round == 1)
    assert (first.state, retry.state) == ("aborted", "closed")
    for pid, participant in participants.items():
        trained = participant.learner.rounds_trained  # type: ignore[attr-defined]
        assert trained == list(range(config.federation.rounds)), f"{pid} trained {trained}"
