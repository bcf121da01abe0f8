"""Masked rounds in process: the coordinator gets only secure sums, and commits their mean.

``federation.aggregation: masking`` runs one secure-aggregation session per group in every
attempt (lensemble.federation.masked_round). These runs use the quadratic test learner, whose
pseudo-gradients reach a few units, so the public clip is 10.
"""

from __future__ import annotations

import statistics
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lensemble.errors import PrecommitCheckFailed, QuorumNotReached
from lensemble.federation.faults import parse_faults
from lensemble.federation.masked_round import _Combiner
from lensemble.federation.masking import flatten, unflatten_into
from lensemble.federation.payload import manifest
from lensemble.federation.secagg.server import SecureSum
from tests.federation.secagg.helpers import context
from tests.support.federation import RankFailingLearner, build, initial_params, small_config

MASKING = {"aggregation": "masking", "masking": {"clip": 10.0}}


def _run(faults: str = "", output_dir: Path | None = None, **federation: Any) -> Any:
    config = small_config(**{**MASKING, **federation})
    coordinator, transport, _ = build(config, faults=parse_faults(faults), output_dir=output_dir)
    return coordinator.run(transport), transport


def _chain(records: Any) -> list[str]:
    return [r.model_hash for r in records if r.state == "closed"]


def test_a_masked_run_commits_one_chain_and_no_update_reaches_the_coordinator() -> None:
    first, transport = _run()
    again, _ = _run()
    assert _chain(first.records) == _chain(again.records) and len(_chain(first.records)) == 3
    # Nothing went through the plain path: no submission was delivered or spooled.
    assert transport.delivered == [] and transport.replies == []
    record = first.records[0]
    group = record.defences["masking"]["groups"][0]
    assert (
        group["survivors"] == sorted(record.contributors) == ["alpha", "bravo", "charlie", "delta"]
    )
    assert group["sum"].startswith("sha256:") and group["clipped"] == 0
    # What the ledger keeps of each contributor is the masked vector it sent: 8 bytes a value.
    d = sum(t.numel() for t in initial_params().values())
    assert all(u["bytes"] > 8 * d for u in record.updates.values())


def test_the_masked_mean_is_the_plain_mean_to_float32_precision() -> None:
    """Without clipping, the secure sums' mean steps the model as the plain mean does."""
    masked, _ = _run()
    plain, _ = _run(
        aggregation="plain", robustness={"aggregator": "mean", "norm_bound_mode": "off"}
    )
    for name, tensor in masked.params.items():
        assert torch.allclose(tensor, plain.params[name], rtol=1e-5, atol=1e-6), name
    assert _chain(masked.records) != _chain(plain.records)  # other bits: the fixed-point sum


@pytest.mark.parametrize(("fault", "stage"), [("drop", "advertise"), ("delay", "mask")])
def test_a_participant_that_drops_out_leaves_the_others_sum_exact(fault: str, stage: str) -> None:
    summary, _ = _run(f"{fault}:bravo@1")
    record = next(r for r in summary.records if r.round == 1 and r.state == "closed")
    group = record.defences["masking"]["groups"][0]
    assert record.contributors == ["alpha", "charlie", "delta"] == group["survivors"]
    assert record.excluded == {"bravo": "masking_dropped"}
    # Dropped before advertising: never in the roster's sets; dropped after sharing: its
    # masking key is reconstructed from the others' shares (it is in `shared`, not survivors).
    assert ("bravo" in group["shared"]) == (stage == "mask")


def test_below_the_threshold_the_attempt_aborts_with_the_reason() -> None:
    # t = 3 of 4: two silent participants leave too few to remove anyone's masks.
    with pytest.raises(QuorumNotReached) as failed:
        _run("drop:bravo@1,drop:charlie@1,drop:bravo@1.1,drop:charlie@1.1", quorum=2)
    assert "masking_aborted:below_threshold" in str(failed.value)


def test_a_corrupt_masked_vector_is_refused_and_its_sender_dropped() -> None:
    summary, _ = _run("corrupt:delta@0")
    record = summary.records[0]
    assert record.state == "closed" and "delta" not in record.contributors
    assert record.excluded["delta"] == "bad_message"


def test_a_masked_run_resumes_to_the_chain_it_would_have_committed(tmp_path: Path) -> None:
    whole, _ = _run()
    _run(output_dir=tmp_path, rounds=2)
    config = small_config(**MASKING)
    coordinator, transport, _ = build(config, output_dir=tmp_path, resume=True)
    resumed = coordinator.run(transport)
    assert resumed.model_hash == whole.model_hash


def test_flatten_and_unflatten_keep_every_value_in_the_architectures_order() -> None:
    params = initial_params(5)
    vector = flatten(params, manifest(params))
    out = {k: torch.zeros_like(v) for k, v in params.items()}
    unflatten_into(vector, out)
    assert all(torch.equal(out[k], params[k]) for k in params)
    with pytest.raises(ValueError, match="cannot fill"):
        unflatten_into(vector[:-1], out)


def test_the_aggregate_bound_scales_a_hostile_sum_down_to_the_recent_norms() -> None:
    """Under masking no update is screened alone; the combined one is bounded instead."""
    wide = {"clip": 100.0}  # the codec's clip lets the attack through: the bound must act
    clean, _ = _run(rounds=6, masking=wide)
    attacked, _ = _run("scaled:alpha@4=-40", rounds=6, masking=wide)
    assert _chain(clean.records)[:4] == _chain(attacked.records)[:4]
    entry = attacked.records[4].defences["masking"]["aggregate"]
    # The hostile sum is far above the bound, and what the outer step takes is at the bound.
    assert entry["norm"] > 3 * entry["bound"]
    assert entry["applied"] == pytest.approx(entry["bound"], rel=1e-6)
    recent = [r.defences["masking"]["aggregate"]["applied"] for r in attacked.records[:4]]
    assert entry["bound"] == pytest.approx(2.0 * statistics.median(recent), rel=1e-12)
    # Without the bound only the pre-commit check stands in the attack's way, and it can only
    # refuse the round: the run ends there.
    with pytest.raises(PrecommitCheckFailed):
        _run("scaled:alpha@4=-40", rounds=6, masking={**wide, "aggregate_factor": None})


def test_a_participant_whose_ranks_failed_is_named_for_that_not_as_a_dropout() -> None:
    config = small_config(**MASKING)
    plan = parse_faults("rank_kill:charlie@1")
    coordinator, transport, _ = build(config, faults=plan, learner=RankFailingLearner)
    record = next(r for r in coordinator.run(transport).records if r.round == 1)
    assert record.state == "closed" and record.excluded == {"charlie": "rank_failure"}


@pytest.mark.parametrize("aggregator", ["mean", "median"])
@pytest.mark.parametrize("groups", [1, 2, 4])
def test_group_sums_are_combined_as_they_end_and_not_kept(aggregator: str, groups: int) -> None:
    # Each group's d-word sum is folded in when its session ends and let go: the coordinator
    # never holds one per group. The result is the survivors' mean, or with 3+ groups and a
    # robust aggregator the median of the group means.
    d, rng = 257, np.random.default_rng(groups)
    combiner = _Combiner(aggregator)
    sums, means, counts, gone = [], [], [], []
    for g in range(groups):
        n = 3 + g
        ctx = context(n, d)
        encoded = np.zeros(d, dtype=np.uint64)
        for update in rng.standard_normal((n, d)).astype(np.float32) * 0.01:
            words = np.empty(d, dtype=np.uint64)
            ctx.codec.encode_into(update, words)
            encoded += words
        sums.append(ctx.codec.decode_sum(encoded.copy()))
        means.append(sums[-1] / n)
        counts.append(n)
        names = tuple(f"g{g}-{i}" for i in range(n))
        total = np.concatenate([encoded, np.array([0, n], dtype=np.uint64)])
        result = SecureSum(total, 0, names, names, names, names, names, ())
        combiner.add(ctx, result)
        gone.append(weakref.ref(result))
        del result
        assert gone[-1]() is None
    expected = (
        np.median(np.stack(means), axis=0)
        if groups >= 3 and aggregator == "median"
        else np.sum(sums, axis=0) / sum(counts)
    )
    assert combiner.survivors == [f"g{g}-{i}" for g in range(groups) for i in range(3 + g)]
    assert np.array_equal(combiner.mean(), expected.astype(np.float32))
