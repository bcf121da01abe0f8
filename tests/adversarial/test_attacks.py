"""The attack faults: their grammar, their arithmetic against the papers, what a participant sends.

Issue 36: a participant that stays inside the bounds (a scaled update under the norm bound, ALIE,
IPM, min-max, min-sum, a sleeper) must be expressible as a fault the participant applies to
itself, in process and over the network alike.
"""

from __future__ import annotations

import statistics

import pytest
import torch

from lensemble.config.schema import OuterOptimizerConfig
from lensemble.errors import UsageError
from lensemble.federation.attacks import (
    AggregateTracker,
    Attacker,
    HonestView,
    alie_z,
    flatten,
    malicious_update,
)
from lensemble.federation.diloco import OuterStep, zeros_like
from lensemble.federation.faults import FaultPlan, parse_faults, participant_faults
from tests.support.federation import build, small_config

IDS = ["alpha", "bravo", "charlie", "delta"]


def _honest(m: int = 5, d: int = 40, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, d, generator=g, dtype=torch.float64) + 0.5


def _fault(spec: str) -> object:
    return parse_faults(spec, IDS).faults[0]


def test_attack_entries_read_back_and_cover_their_rounds() -> None:
    spec = (
        "scaled:delta@0-=-9.5,alie:alpha@10-,ipm:bravo@2-5=4.0,minmax:charlie@0-=sign,"
        "minsum:delta@3,misreport:alpha@0-=0.1,alie_omniscient:bravo@1-,drop:alpha@4-6"
    )
    plan = parse_faults(spec, IDS)
    assert parse_faults(plan.spec(), IDS).spec() == plan.spec() == spec
    ipm = plan.faults[2]
    assert [r for r in range(8) if ipm.applies(r, 0)] == [2, 3, 4, 5]
    sleeper = plan.faults[1]
    assert not sleeper.applies(9, 0) and sleeper.applies(10, 0) and sleeper.applies(10_000, 3)
    assert plan.attackers() == {"alpha", "bravo", "charlie", "delta"}
    assert plan.attack_on("alpha", 9, 0) is None and plan.attack_on("alpha", 10, 0) is sleeper


@pytest.mark.parametrize(
    "bad",
    [
        "scaled:delta@0-",  # the factor is required
        "scaled:delta@0-=nan",
        "minmax:delta@0-=sideways",
        "ipm:delta@5-2=4",  # ends before it starts
        "misreport:delta@0-=-1",
        "alie@3-",  # needs a participant
        "sleeper:delta@3",  # not a kind: a sleeper is an attack with a later first round
    ],
)
def test_malformed_attack_entries_are_refused_with_an_example(bad: str) -> None:
    with pytest.raises(UsageError):
        parse_faults(bad, IDS)


def test_a_participant_process_takes_its_attacks_but_not_the_omniscient_ones() -> None:
    plan = participant_faults("alie:alpha@0-,scaled:bravo@2-=-3,rank_kill:alpha@1", IDS, "alpha")
    assert plan.spec() == "alie:alpha@0-,rank_kill:alpha@1=1"
    assert plan.hostile == 2  # f of ALIE's z counts every attacker of the whole plan
    with pytest.raises(UsageError, match="in-process transport only"):
        participant_faults("alie_omniscient:alpha@0-", IDS, "alpha")


def test_alie_z_follows_baruch_et_al() -> None:
    assert alie_z(4, 1) == 0.0  # s = 2: (4 - 2) / 4 = 0.5
    assert alie_z(8, 2) == pytest.approx(statistics.NormalDist().inv_cdf(5 / 8))
    assert alie_z(50, 24) == pytest.approx(statistics.NormalDist().inv_cdf(48 / 50))
    assert alie_z(4, 3) == pytest.approx(statistics.NormalDist().inv_cdf(0.999))  # kept finite


def test_each_attack_is_its_formula() -> None:
    honest = _honest()
    own = honest[0] * 1.3
    view = HonestView(honest, own)
    mu, sigma = honest.mean(0), honest.std(0, unbiased=True)
    sent = malicious_update(_fault("scaled:delta@0=-9.5"), view, 8, 2)  # type: ignore[arg-type]
    assert torch.equal(sent, -9.5 * own)
    sent = malicious_update(_fault("alie:delta@0=1.5"), view, 8, 2)  # type: ignore[arg-type]
    assert torch.allclose(sent, mu - 1.5 * sigma)
    sent = malicious_update(_fault("alie:delta@0"), view, 8, 2)  # type: ignore[arg-type]
    assert torch.allclose(sent, mu - alie_z(8, 2) * sigma)
    sent = malicious_update(_fault("ipm:delta@0=4"), view, 8, 2)  # type: ignore[arg-type]
    assert torch.allclose(sent, -4 * mu)
    sent = malicious_update(_fault("ipm:delta@0"), view, 8, 2)  # type: ignore[arg-type]
    assert torch.allclose(sent, -0.5 * mu)


@pytest.mark.parametrize("kind", ["minmax", "minsum"])
@pytest.mark.parametrize("direction", ["std", "unit", "sign"])
def test_min_max_and_min_sum_go_as_far_as_the_honest_spread_allows(
    kind: str, direction: str
) -> None:
    honest = _honest()
    view = HonestView(honest, honest[0])
    sent = malicious_update(_fault(f"{kind}:delta@0={direction}"), view, 8, 2)  # type: ignore[arg-type]
    mu = honest.mean(0)
    assert not torch.allclose(sent, mu)  # it does move away from the mean

    def measure(x: torch.Tensor) -> float:
        distances = torch.linalg.vector_norm(honest - x, dim=1)
        return float(distances.max() if kind == "minmax" else (distances**2).sum())

    pairwise = torch.cdist(honest, honest)
    bound = float(pairwise.max() if kind == "minmax" else (pairwise**2).sum(1).max())
    assert measure(sent) <= bound
    further = mu + (sent - mu) * 1.001  # a little further along p is no longer plausible
    assert measure(further) > bound


def test_the_tracker_recovers_the_previous_aggregate_from_two_models() -> None:
    g = torch.Generator().manual_seed(4)
    theta = {"w": torch.randn(6, generator=g), "b": torch.randn(3, generator=g)}
    for lr, mu, nesterov in [(0.7, 0.9, True), (1.0, 0.5, True), (1.0, 0.5, False), (1.0, 0, True)]:
        outer = OuterStep(lr, mu, nesterov)
        tracker = AggregateTracker(OuterOptimizerConfig(lr=lr, momentum=mu, nesterov=nesterov))
        params, momentum = dict(theta), zeros_like(theta)
        tracker.observe(0, params)
        assert tracker.aggregate is None
        for version in range(1, 5):
            combined = {k: torch.randn(v.shape, generator=g) for k, v in theta.items()}
            params, momentum = outer.apply(params, combined, momentum)
            tracker.observe(version, params)
            tracker.observe(version, params)  # a retry of the same version changes nothing
            assert tracker.aggregate is not None
            assert torch.allclose(tracker.aggregate, flatten(combined), atol=1e-5)
        tracker.observe(7, params)  # a gap: nothing to recover from
        assert tracker.aggregate is None


def test_an_estimating_attacker_uses_its_update_and_the_recovered_aggregate() -> None:
    outer = OuterOptimizerConfig(lr=1.0, momentum=0.0, nesterov=False)
    attacker = Attacker(parse_faults("ipm:delta@1-=2,alie:delta@0=1"), "delta", 4, outer)
    own = {"w": torch.tensor([1.0, -2.0]), "b": torch.tensor([0.5])}
    attacker.observe(0, {"w": torch.tensor([3.0, 3.0]), "b": torch.tensor([1.0])})
    # Round 0, nothing recovered yet: H = {own}, sigma = 0, so ALIE sends its own update.
    sent = attacker.tamper(0, 0, own)
    assert all(torch.equal(sent[k], own[k]) for k in own)
    attacker.observe(1, {"w": torch.tensor([2.0, 3.5]), "b": torch.tensor([1.0])})
    # g = theta_0 - theta_1 (lr 1, no momentum) = (1, -0.5, 0); IPM sends -2 g.
    sent = attacker.tamper(1, 0, own)
    assert torch.allclose(sent["w"], torch.tensor([-2.0, 1.0])) and float(sent["b"]) == 0.0
    assert attacker.report(1, 0, 0.25) == 0.25  # no misreport entry


def test_a_participant_sends_what_its_attack_says_from_its_first_round_on() -> None:
    config = small_config(rounds=3)
    honest, transport, _ = build(config)
    clean = honest.run(transport).records
    attacked, transport, _ = build(config, faults=parse_faults("scaled:delta@1-=-3"))
    records = attacked.run(transport).records
    # Honest before round 1 (the payload itself differs: it carries its compute time).
    assert records[0].defences["norms"] == clean[0].defences["norms"]
    ratio = records[1].defences["norms"]["delta"] / clean[1].defences["norms"]["delta"]
    assert ratio == pytest.approx(3.0, rel=1e-5)  # the same base model in round 1
    assert records[1].defences["clipped"]["delta"] < 1  # clipped to the round's median
    assert records[1].defences["cosines"]["delta"] < 0 < clean[1].defences["cosines"]["delta"]


def test_misreport_changes_only_the_report() -> None:
    config = small_config(rounds=2)
    plain, transport, _ = build(config)
    records = plain.run(transport).records
    lying, transport, _ = build(config, faults=parse_faults("misreport:delta@0-=0.5"))
    lied = lying.run(transport).records
    assert [r.model_hash for r in lied] == [r.model_hash for r in records]
    for r, lie in zip(records, lied, strict=True):
        assert lie.self_reported["delta"]["heldout_loss"] == pytest.approx(
            0.5 * r.self_reported["delta"]["heldout_loss"]
        )
        assert (
            lie.self_reported["alpha"]["heldout_loss"] == r.self_reported["alpha"]["heldout_loss"]
        )


def test_an_omniscient_attacker_sees_the_honest_updates_of_its_attempt() -> None:
    config = small_config(rounds=2, quantization="none")
    coordinator, transport, participants = build(
        config, faults=parse_faults("ipm_omniscient:delta@0-=1")
    )
    seen: list[dict[str, object]] = []
    attacker = participants["delta"].attacker
    assert attacker is not None
    tamper = attacker.tamper

    def spy(round_index: int, attempt: int, delta: object, peers: object = None) -> object:
        seen.append(dict(peers or {}))  # type: ignore[call-overload]
        return tamper(round_index, attempt, delta, peers)  # type: ignore[arg-type]

    attacker.tamper = spy  # type: ignore[method-assign]
    record = coordinator.run(transport).records[0]
    assert sorted(seen[0]) == ["alpha", "bravo", "charlie"]
    # Its update is minus the honest mean: its cosine with each honest update is negative.
    mean = torch.stack([flatten(u) for u in seen[0].values()]).mean(0)  # type: ignore[arg-type]
    assert record.defences["norms"]["delta"] == pytest.approx(float(mean.norm()), rel=1e-5)


def test_a_plan_without_attacks_makes_nobody_an_attacker() -> None:
    _, _, participants = build(small_config(), faults=parse_faults("drop:alpha@1"))
    assert all(p.attacker is None for p in participants.values())
    _, _, participants = build(small_config(), faults=FaultPlan())
    assert all(p.attacker is None for p in participants.values())
