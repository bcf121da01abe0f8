"""Defences against finite poisoned updates: norm bounds, robust aggregators, pre-commit check.

Issue 12 item 2: an update of every value 1e4 (or 3e38) was accepted and steered the model.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from lensemble.config.load import validate_mapping
from lensemble.config.schema import RobustnessConfig
from lensemble.errors import ConfigError, PrecommitCheckFailed, UsageError
from lensemble.federation.diloco import canonical_mean
from lensemble.federation.faults import parse_faults, poison_payload
from lensemble.federation.ledger import committed_chain
from lensemble.federation.payload import decode, encode, manifest
from lensemble.federation.quantization import dequantize, quantize
from lensemble.federation.robustness import (
    aggregate,
    coordinate_median,
    coordinate_trimmed_mean,
    cosine,
    lift_to_floor,
    momentum_shortfalls,
    norm_bound,
    precommit_problem,
    screen,
    trim_count,
    update_dot,
    update_norm,
)
from tests.support.federation import build, initial_params, small_config, small_federation

IDS = ("alpha", "bravo", "charlie", "delta", "echo")


def deltas(n: int = 5, seed: int = 0) -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return {
        pid: {"w": torch.randn(3, 4, generator=g), "b": torch.randn(5, generator=g)}
        for pid in IDS[:n]
    }


def test_update_norm_is_the_l2_norm_over_every_tensor() -> None:
    d = {"a": torch.tensor([3.0]), "b": torch.tensor([[4.0, 0.0]])}
    assert update_norm(d) == 5.0
    assert update_norm({"a": torch.full((4,), 3e38)}) == pytest.approx(6e38)  # no overflow


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_median_matches_the_definition(n: int) -> None:
    d = deltas(n)
    got = coordinate_median(d)
    for name in ("w", "b"):
        stacked, _ = torch.sort(torch.stack([d[p][name] for p in sorted(d)]), dim=0)
        want = stacked[n // 2] if n % 2 else stacked[n // 2 - 1] * 0.5 + stacked[n // 2] * 0.5
        assert torch.equal(got[name], want)


def test_trimmed_mean_drops_both_ends_per_coordinate() -> None:
    d = deltas(5)
    assert trim_count(5, 0.25) == 2 and trim_count(4, 0.25) == 1 and trim_count(2, 0.4) == 0
    got = coordinate_trimmed_mean(d, 0.2)  # one value dropped at each end
    for name in ("w", "b"):
        stacked, _ = torch.sort(torch.stack([d[p][name] for p in sorted(d)]), dim=0)
        want = (stacked[1] + stacked[2] + stacked[3]) / 3
        assert torch.allclose(got[name], want, rtol=0, atol=1e-6)
    untrimmed = coordinate_trimmed_mean(d, 0.0)
    assert all(torch.allclose(untrimmed[k], v, atol=1e-6) for k, v in canonical_mean(d).items())


@pytest.mark.parametrize("aggregator", ["mean", "trimmed_mean", "median"])
def test_aggregators_do_not_depend_on_arrival_order(aggregator: str) -> None:
    config = RobustnessConfig(aggregator=aggregator)
    d = deltas(5)
    first = aggregate(d, config)
    for order in itertools.islice(itertools.permutations(d), 1, 6):
        again = aggregate({pid: d[pid] for pid in order}, config)
        assert all(torch.equal(first[k], again[k]) for k in first)


def test_the_mean_aggregator_is_diloco_s_canonical_mean_bit_for_bit() -> None:
    d = deltas(4)
    mean = aggregate(d, RobustnessConfig())
    assert all(torch.equal(mean[k], v) for k, v in canonical_mean(d).items())


def test_one_poisoned_update_cannot_move_the_median_or_trimmed_mean_out_of_the_honest_range() -> (
    None
):
    d = deltas(4)
    d["delta"] = {k: torch.full_like(v, 1e4) for k, v in d["delta"].items()}
    for aggregator in ("median", "trimmed_mean"):
        out = aggregate(d, RobustnessConfig(aggregator=aggregator))
        for name, value in out.items():
            honest = torch.stack([d[p][name] for p in ("alpha", "bravo", "charlie")])
            assert bool((value <= honest.max(0).values).all()), aggregator
            assert bool((value >= honest.min(0).values).all()), aggregator


def test_clipping_scales_only_the_outlier_down_to_k_times_the_median() -> None:
    d = deltas(4)
    d["delta"] = {k: torch.full_like(v, 1e4) for k, v in d["delta"].items()}
    config = RobustnessConfig(median_factor=3.0)
    result = screen(d, config)
    assert set(result.clipped) == {"delta"}
    middle = sorted(result.norms.values())[1:3]
    assert result.bound == pytest.approx(3.0 * (middle[0] + middle[1]) / 2)
    assert update_norm(result.kept["delta"]) == pytest.approx(result.bound, rel=1e-6)
    for pid in ("alpha", "bravo", "charlie"):
        assert all(result.kept[pid][k] is d[pid][k] for k in d[pid])  # untouched
    record = result.to_record()
    assert record["clipped"]["delta"] < 1e-3 and record["norms"]["delta"] > 1e4


def test_reject_mode_and_an_absolute_bound() -> None:
    d = deltas(4)
    d["delta"] = {k: torch.full_like(v, 3e38) for k, v in d["delta"].items()}
    config = RobustnessConfig(norm_bound_mode="reject", norm_bound=10.0, median_factor=10.0)
    result = screen(d, config)
    assert set(result.kept) == {"alpha", "bravo", "charlie"}
    assert "above the round's bound" in result.rejected["delta"]
    assert result.bound == 10.0  # the absolute bound is below k x median here
    assert norm_bound({"a": 1.0}, RobustnessConfig(norm_bound_mode="off")) is None
    assert norm_bound({"a": 0.0, "b": 0.0}, RobustnessConfig()) is None


def test_precommit_refuses_non_finite_or_far_moved_models() -> None:
    theta = {"w": torch.ones(4)}
    assert precommit_problem(theta, {"w": torch.ones(4) * 1.5}, 1.0) == (0.5, None)
    change, problem = precommit_problem(theta, {"w": torch.ones(4) * 9}, 1.0)
    assert change == 8.0 and problem is not None and "max_relative_change" in problem
    change, problem = precommit_problem(theta, {"w": torch.tensor([1.0, float("nan"), 0, 0])}, 1.0)
    assert change is None and problem is not None and "NaN" in problem


@pytest.mark.parametrize(
    "robustness",
    [
        {"trim_fraction": 0.5},
        {"median_factor": 0.5},
        {"norm_bound": 0},
        {"max_int8_scale": 1e31},
        {"max_relative_change": 0},
        {"aggregator": "krum"},
        {"norm_bound_mode": "ignore"},
    ],
)
def test_the_schema_enforces_the_documented_ranges(robustness: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        validate_mapping({"federation": small_federation(robustness=robustness)})


def test_poison_fault_parses_and_sets_every_value() -> None:
    plan = parse_faults("poison:delta@2=1e4,poison:alpha@0.1=-3e38", ["alpha", "delta"])
    assert [(f.participant, f.round_index, f.attempt, f.value) for f in plan.faults] == [
        ("delta", 2, None, 1e4),
        ("alpha", 0, 1, -3e38),
    ]
    for bad in ("poison:delta@2", "poison:delta@2=x", "poison@2=1", "drop:delta@2=1"):
        with pytest.raises(UsageError):
            parse_faults(bad, ["delta"])
    for scheme in ("none", "int8"):
        theta = initial_params()
        payload = encode(quantize(theta, scheme), {"round": "2"})
        poisoned, digest = poison_payload(payload, 1e4)
        decoded = decode(poisoned)
        assert decoded.metadata["round"] == "2" and digest.startswith("sha256:")
        values = dequantize(decoded.tensors, manifest(theta), scheme)
        assert all(torch.allclose(v, torch.full_like(v, 1e4)) for v in values.values())


def test_a_poisoned_round_is_clipped_and_recorded_in_the_ledger() -> None:
    # The toy federation's updates are larger than its model: allow the clipped step. A bound
    # at 10 x the median, far above the honest spread, clips the poisoned update alone.
    config = small_config(rounds=2, robustness={"max_relative_change": 1000, "median_factor": 10})
    coordinator, transport, _ = build(config, faults=parse_faults("poison:delta@1=1e4"))
    summary = coordinator.run(transport)
    record = summary.records[1]
    assert record.state == "closed"
    assert record.defences["clipped"].keys() == {"delta"}
    assert record.defences["norms"]["delta"] > 1e4
    assert record.defences["relative_change"] < 1000
    assert summary.records[0].defences["clipped"] == {}
    assert all(set(r.self_reported) == set(r.contributors) for r in summary.records)


def test_reject_mode_leaves_the_poisoned_update_out_and_says_why() -> None:
    config = small_config(rounds=2, robustness={"norm_bound_mode": "reject", "median_factor": 3})
    coordinator, transport, _ = build(config, faults=parse_faults("poison:delta@1=1e4"))
    record = coordinator.run(transport).records[1]
    assert record.contributors == ["alpha", "bravo", "charlie"]
    assert record.excluded == {"delta": "norm_bound"}
    assert "above the round's bound" in record.defences["rejected"]["delta"]["detail"]


def test_a_model_failing_the_precommit_check_is_never_committed() -> None:
    config = small_config(rounds=2, robustness={"norm_bound_mode": "off"})
    coordinator, transport, _ = build(config, faults=parse_faults("poison:delta@1=1e4"))
    with pytest.raises(PrecommitCheckFailed, match="pre-commit check"):
        coordinator.run(transport)
    assert coordinator.version == 1  # round 0 committed, round 1 never
    aborted = [r for r in coordinator.records if r.round == 1]
    assert [r.state for r in aborted] == ["aborted", "aborted"]
    assert all(r.model_hash == r.parent_hash for r in aborted)
    assert "max_relative_change" in aborted[0].defences["precommit"]


def test_honest_chain_is_unchanged_by_a_norm_bound_above_the_honest_spread() -> None:
    # Clip at 10 x the median norm (the default before issue 36; never reached by honest
    # updates) and the pre-commit check: the chain of the plain mean.
    plain = small_config(robustness={"norm_bound_mode": "off", "max_relative_change": 1e6})
    guarded = small_config(robustness={"median_factor": 10})
    chains = []
    for config in (plain, guarded):
        coordinator, transport, _ = build(config)
        chains.append(committed_chain(coordinator.run(transport).records))
    assert chains[0] == chains[1]


def test_the_momentum_floor_takes_out_only_the_pull_beyond_it() -> None:
    # Issue 36: an update pulling against the outer momentum (inner-product manipulation)
    # keeps only a cosine of momentum_cosine_floor with it; the others are untouched.
    d = deltas(4)
    momentum = {k: v.clone() for k, v in d["alpha"].items()}  # the direction moved in so far
    d["delta"] = {k: -3 * v for k, v in momentum.items()}  # straight against it
    config = RobustnessConfig(median_factor=None, momentum_cosine_floor=-0.3)
    screening = screen(d, config)
    reference = update_norm(momentum)
    cosines = {p: cosine(d[p], screening.norms[p], momentum, reference) for p in d}
    screening.shortfalls = momentum_shortfalls(screening, cosines, -0.3)
    assert set(screening.shortfalls) == {"delta"} and cosines["delta"] == pytest.approx(-1.0)
    combined = aggregate(screening.kept, config)
    lift_to_floor(combined, momentum, screening)
    # By hand: delta loses its component along the momentum beyond -0.3 x its norm.
    unit = {k: v.double() / reference for k, v in momentum.items()}
    norm = screening.norms["delta"]
    lifted = {k: d["delta"][k].double() + 0.7 * norm * unit[k] for k in unit}
    assert update_dot(lifted, unit) == pytest.approx(-0.3 * norm, rel=1e-6)
    by_hand = {
        k: (sum(d[p][k].double() for p in ("alpha", "bravo", "charlie")) + lifted[k]) / 4
        for k in unit
    }
    assert all(torch.allclose(combined[k].double(), by_hand[k], atol=1e-5) for k in unit)
    # Without shortfalls nothing changes, bit for bit.
    untouched = aggregate(screening.kept, config)
    screening.shortfalls = {}
    lift_to_floor(untouched, momentum, screening)
    assert all(torch.equal(untouched[k], aggregate(screening.kept, config)[k]) for k in unit)
