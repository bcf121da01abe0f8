"""The session driver: an answer counts for the participant the transport authenticated."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lensemble.federation.secagg.driver import ANSWERED, STAGES
from lensemble.federation.secagg.errors import Reason
from lensemble.federation.secagg.local import run_session
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
