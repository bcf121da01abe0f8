"""The unmasked sum equals the plain fixed-point sum bit for bit, whoever drops out when.

Dropouts at every stage (before advertising, after advertising keys, after sharing, after the
masked upload, after the consistency signature, i.e. during unmasking), any arrival order, any
n and d; below the threshold the session aborts with ``below_threshold``. Reruns give the same
bits: the same messages, the same sum.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from lensemble.federation.secagg.errors import Reason, SecAggAbort
from lensemble.federation.secagg.local import DropAfter
from tests.federation.secagg.helpers import Recorder, context, plain_sum, run, updates

#: The stages in order and who is still there at each, given when each participant drops.
_LAST = {
    DropAfter.START: -1,
    DropAfter.ADVERTISE: 0,
    DropAfter.SHARE: 1,
    DropAfter.MASK: 2,
    DropAfter.CONSISTENCY: 3,
    DropAfter.NEVER: 4,
}


def expected_sets(roster: tuple[str, ...], drop: dict[str, DropAfter]) -> list[tuple[str, ...]]:
    """U1 (advertised) .. U5 (unmasked): who completes each stage."""
    return [
        tuple(p for p in roster if _LAST[drop.get(p, DropAfter.NEVER)] >= stage)
        for stage in range(5)
    ]


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(3, 9),
    d=st.integers(1, 300),
    data=st.data(),
)
def test_the_unmasked_sum_is_the_plain_sum_for_any_dropouts_and_order(
    n: int, d: int, data: st.DataObject
) -> None:
    ctx = context(n, d)
    roster = ctx.roster
    # Up to one dropout more than the session tolerates, each at any stage, so that examples
    # both commit and abort.
    leaving = data.draw(
        st.lists(st.sampled_from(roster), max_size=n - ctx.min_survivors + 1, unique=True)
    )
    stages = [s for s in DropAfter if s is not DropAfter.NEVER]
    drop = {p: data.draw(st.sampled_from(stages)) for p in leaving}
    order_seed = data.draw(st.integers(0, 2**32))
    ups = updates(roster, d, scale=data.draw(st.sampled_from([1e-3, 0.1, 3.0])), seed=n * 1000 + d)
    u1, u2, u3, u4, u5 = expected_sets(roster, drop)
    enough = (
        min(len(u1), len(u2), len(u3)) >= ctx.min_survivors
        and min(len(u4), len(u5)) >= ctx.threshold
    )
    if not enough:
        with pytest.raises(SecAggAbort) as caught:
            run(ctx, ups, drop=drop, order_seed=order_seed)
        assert caught.value.reason is Reason.BELOW_THRESHOLD
        event("aborted below threshold")
        return
    result = run(ctx, ups, drop=drop, order_seed=order_seed)
    event(f"committed with {len(u2) - len(u3)} dropped, {n - len(u5)} gone by unmasking")
    s = result.sum
    assert (s.advertised, s.shared, s.survivors, s.signed, s.unmasked) == (u1, u2, u3, u4, u5)
    assert s.total.tobytes() == plain_sum(ctx, ups, u3).tobytes()
    assert s.clipped == sum(int(np.count_nonzero(np.abs(ups[p]) > 1.0)) for p in u3)
    assert not result.refusals and not s.refusals


@pytest.mark.parametrize(
    "stage",
    [DropAfter.START, DropAfter.ADVERTISE, DropAfter.SHARE, DropAfter.MASK, DropAfter.CONSISTENCY],
)
def test_two_dropouts_at_one_stage_still_commit(stage: DropAfter) -> None:
    ctx = context(8, 64)  # t = 6: two may drop
    ups = updates(ctx.roster, 64)
    drop = {ctx.roster[1]: stage, ctx.roster[6]: stage}
    result = run(ctx, ups, drop=drop)
    u3 = expected_sets(ctx.roster, drop)[2]
    assert result.sum.survivors == u3
    assert result.sum.total.tobytes() == plain_sum(ctx, ups, u3).tobytes()
    if stage is DropAfter.SHARE:
        assert result.sum.dropped == (ctx.roster[1], ctx.roster[6])


@pytest.mark.parametrize(
    ("stage", "where"),
    [
        (DropAfter.START, "advertise"),
        (DropAfter.ADVERTISE, "share"),
        (DropAfter.SHARE, "mask"),
        (DropAfter.MASK, "consistency"),
        (DropAfter.CONSISTENCY, "unmask"),
    ],
)
def test_too_many_dropouts_at_any_stage_abort_below_threshold(stage: DropAfter, where: str) -> None:
    ctx = context(6, 16)  # t = 5: two dropouts leave 4
    drop = {ctx.roster[0]: stage, ctx.roster[3]: stage}
    with pytest.raises(SecAggAbort) as caught:
        run(ctx, updates(ctx.roster, 16), drop=drop)
    assert caught.value.reason is Reason.BELOW_THRESHOLD
    assert caught.value.stage == where
    assert "fewer than the 5 needed" in str(caught.value)


def test_the_quorum_raises_the_fewest_survivors() -> None:
    ctx = context(8, 8, quorum=8)
    with pytest.raises(SecAggAbort, match="fewer than the 8 needed"):
        run(ctx, updates(ctx.roster, 8), drop={ctx.roster[2]: DropAfter.SHARE})


def test_arrival_order_changes_no_bit() -> None:
    ctx = context(7, 200)
    ups = updates(ctx.roster, 200)
    drop = {ctx.roster[2]: DropAfter.SHARE, ctx.roster[5]: DropAfter.CONSISTENCY}
    digests = {run(ctx, ups, drop=drop, order_seed=seed).sum.digest() for seed in range(6)}
    assert len(digests) == 1


def test_a_rerun_sends_and_sums_the_same_bits() -> None:
    ctx = context(5, 100)
    ups = updates(ctx.roster, 100)
    first, second = Recorder(), Recorder()
    a = run(ctx, ups, recorder=first, drop={ctx.roster[4]: DropAfter.MASK})
    b = run(ctx, ups, recorder=second, drop={ctx.roster[4]: DropAfter.MASK})
    assert first.log == second.log
    assert a.sum.digest() == b.sum.digest()


def test_another_attempt_masks_with_other_bits() -> None:
    ups = updates(context(4, 50).roster, 50)
    masked = []
    for attempt in (0, 1):
        recorder = Recorder()
        run(context(4, 50, attempt=attempt), ups, recorder=recorder)
        masked.append(
            [
                data
                for direction, stage, _, data in recorder.log
                if (direction, stage) == ("up", "mask")
            ]
        )
    assert not set(masked[0]) & set(masked[1])


def test_the_mean_decodes_from_the_sum() -> None:
    ctx = context(4, 1000)
    ups = updates(ctx.roster, 1000)
    s = run(ctx, ups).sum
    mean = ctx.codec.decode_mean(s.total, len(s.survivors))
    exact = np.mean(np.stack([ups[p] for p in ctx.roster]).astype(np.float64), axis=0)
    assert mean.dtype == np.float32
    assert np.max(np.abs(mean - exact)) < 1e-9
