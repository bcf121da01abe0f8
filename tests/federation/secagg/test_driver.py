"""The session driver: an answer counts for the participant the transport authenticated."""

from __future__ import annotations

import dataclasses
import functools
import mmap
import weakref
from collections.abc import Iterator, Mapping

import numpy as np
import pytest

from lensemble.federation.secagg.driver import ANSWERED, STAGES, Party, drive
from lensemble.federation.secagg.errors import Reason
from lensemble.federation.secagg.local import run_session
from lensemble.federation.secagg.participant import ParticipantSession
from lensemble.federation.secagg.server import ServerSession
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
