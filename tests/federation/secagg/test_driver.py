"""The session driver: an answer counts for the participant the transport authenticated."""

from __future__ import annotations

import dataclasses
import functools
import mmap
import weakref
from collections.abc import Iterator, Mapping

import numpy as np
import pytest

from lensemble.federation.secagg.driver import ANSWERED, STAGES, Party, drive, drive_together
from lensemble.federation.secagg.errors import Reason, SecAggAbort
from lensemble.federation.secagg.local import run_session
from lensemble.federation.secagg.participant import ParticipantSession
from lensemble.federation.secagg.server import SecureSum, ServerSession
from tests.federation.secagg.helpers import context, identity_keys, ids, plain_sum, seeds, updates


@pytest.mark.parametrize("stage", STAGES)
def test_a_participant_cannot_answer_in_another_ones_name(stage: str) -> None:
    n, d = 5, 64
    ctx, roster = context(n, d), ids(n)
    ups = updates(roster, d)
    liar, victim = roster[0], roster[1]

    def impersonate(at: str, sender: str, data: bytes) -> bytes:
        if at != stage or sender != liar:
            return data
        message = ANSWERED[stage].decode(data)
        return dataclasses.replace(message, sender=victim).encode()  # type: ignore[no-any-return]

    result = run_session(ctx, ups, seeds(roster), identity_keys(roster), forge=impersonate)
    assert (liar, Reason.UNKNOWN_PARTICIPANT.value) in set(result.sum.refusals)
    # The victim's own answer still counts; the liar is out from the stage it lied in.
    assert victim in result.sum.survivors
    if stage in ("advertise", "share", "mask"):
        assert liar not in result.sum.survivors
        expected = plain_sum(ctx, ups, result.sum.survivors)
        assert np.array_equal(result.sum.total[:d], expected[:d])


def test_a_summed_masked_vector_is_let_go_before_the_next_one_is_asked_for() -> None:
    # Each masked vector arrives as a view of its own mapping, as a landed upload does over the
    # network; the session must have added it and dropped every reference before it asks for
    # the next one, so the coordinator never holds two (let alone all n) at once.
    n, d = 5, 4096
    ctx, roster = context(n, d), ids(n)
    ups = updates(roster, d)
    keys = identity_keys(roster)
    verifiers = {p: key.public_key() for p, key in keys.items()}
    secrets = seeds(roster)
    parties = {
        p: Party(
            ParticipantSession(ctx, p, secrets[p], keys[p], verifiers),
            functools.partial(ups.__getitem__, p),
        )
        for p in roster
    }
    alive: list[weakref.ref[mmap.mmap]] = []

    def exchange(stage: str, outgoing: Mapping[str, bytes]) -> Iterator[tuple[str, memoryview]]:
        for p in roster:
            if p not in outgoing:
                continue
            answer = parties[p].answer(stage, outgoing[p])
            assert all(ref() is None for ref in alive), "an earlier masked vector is still held"
            mapped = mmap.mmap(-1, len(answer))
            mapped.write(answer)
            if stage == "mask":
                alive.append(weakref.ref(mapped))
            view = memoryview(mapped)
            del mapped, answer
            yield p, view
            del view

    result = drive(ServerSession(ctx, verifiers), exchange)
    assert len(alive) == n
    assert all(ref() is None for ref in alive)
    assert result.survivors == roster
    assert np.array_equal(result.total[:d], plain_sum(ctx, ups, roster))


def test_groups_run_in_lock_step_one_exchange_per_stage_and_sum_as_alone() -> None:
    # Three groups: group 0 loses a member at the masked upload, group 1 one at key sharing,
    # group 2 (3 members, threshold 3) one at key sharing and aborts. Each stage of every running
    # group goes out in one exchange (one deadline, however many groups have silent members),
    # and each group's sum is the one its session gives alone.
    d, roster = 64, ids(13)
    rosters = (roster[:5], roster[5:10], roster[10:])
    # Each group's default threshold: 4 of 5, and 3 of 3.
    contexts = [
        dataclasses.replace(context(len(members), d), group=g, roster=members)
        for g, members in enumerate(rosters)
    ]
    silent = {roster[1]: "mask", roster[6]: "share", roster[11]: "share"}
    ups = updates(roster, d)
    keys = identity_keys(roster)
    verifiers = {p: key.public_key() for p, key in keys.items()}
    secrets = seeds(roster)

    def parties() -> dict[str, Party]:
        return {
            p: Party(
                ParticipantSession(ctx, p, secrets[p], keys[p], verifiers),
                functools.partial(ups.__getitem__, p),
            )
            for ctx in contexts
            for p in ctx.roster
        }

    def answers(
        everyone: dict[str, Party], stage: str, outgoing: Mapping[str, bytes]
    ) -> Iterator[tuple[str, bytes]]:
        for p in sorted(outgoing, reverse=True):
            quiet_from = STAGES.index(silent[p]) if p in silent else len(STAGES)
            if STAGES.index(stage) < quiet_from:
                yield p, everyone[p].answer(stage, outgoing[p])

    calls: list[tuple[str, set[int]]] = []
    together = parties()

    def exchange(
        stage: str, outgoing: Mapping[str, tuple[int, bytes]]
    ) -> Iterator[tuple[str, bytes]]:
        calls.append((stage, {group for group, _ in outgoing.values()}))
        yield from answers(together, stage, {p: data for p, (_, data) in outgoing.items()})

    servers = {ctx.group: ServerSession(ctx, verifiers) for ctx in contexts}
    outcomes = drive_together(servers, exchange)
    assert calls == [
        ("advertise", {0, 1, 2}),
        ("share", {0, 1, 2}),
        ("mask", {0, 1}),  # group 2 aborted when its sharing closed below threshold
        ("consistency", {0, 1}),
        ("unmask", {0, 1}),
    ]
    assert isinstance(outcomes[2], SecAggAbort)
    assert outcomes[2].reason is Reason.BELOW_THRESHOLD
    alone = parties()
    for ctx in contexts[:2]:
        together_sum = outcomes[ctx.group]
        assert isinstance(together_sum, SecureSum)
        own = drive(ServerSession(ctx, verifiers), functools.partial(answers, alone))
        assert together_sum.survivors == own.survivors
        assert set(ctx.roster) - set(own.survivors) == set(silent) & set(ctx.roster)
        assert np.array_equal(together_sum.total, own.total)
        assert np.array_equal(together_sum.total[:d], plain_sum(ctx, ups, own.survivors)[:d])
