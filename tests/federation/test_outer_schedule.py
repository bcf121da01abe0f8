"""The outer optimizer's schedule: coefficients halve per half-life, recorded, resumable."""

from __future__ import annotations

from pathlib import Path

import pytest

from lensemble.config.hashing import config_hash
from lensemble.errors import ConfigError
from lensemble.federation.diloco import OuterStep
from lensemble.federation.ledger import committed_chain
from tests.support.federation import build, small_config

SCHEDULE = {"lr": 0.7, "momentum": 0.9, "nesterov": True, "lr_half_life_rounds": 2.0}


def test_each_coefficient_halves_every_half_life_and_none_keeps_it() -> None:
    outer = OuterStep(0.8, 0.6, True)
    assert outer.at(0, 3.0, 2.0) == outer
    assert outer.at(3, 3.0, None) == OuterStep(0.4, 0.6, True)
    assert outer.at(4, None, 2.0) == OuterStep(0.8, 0.15, True)
    assert outer.at(7, None, None) == outer


def test_a_held_learning_rate_starts_halving_after_the_hold() -> None:
    outer = OuterStep(1.2, 0.5, True)
    assert [outer.at(v, 2.0, None, 3).lr for v in (0, 3, 5, 7)] == pytest.approx(
        [1.2, 1.2, 0.6, 0.3]
    )
    assert outer.at(9, 2.0, 4.0, 3).momentum == pytest.approx(0.5 * 0.5 ** (9 / 4.0))
    assert outer.at(5, None, None, 3) == outer  # a hold without a decay holds nothing


def test_a_hold_without_a_half_life_is_refused_naming_both_fields() -> None:
    with pytest.raises(ConfigError, match="lr_half_life_rounds.*lr_hold_rounds"):
        small_config(outer_optimizer={**SCHEDULE, "lr_half_life_rounds": None, "lr_hold_rounds": 4})
    held = small_config(outer_optimizer={**SCHEDULE, "lr_hold_rounds": 4})
    assert held.federation.outer_optimizer.lr_hold_rounds == 4


def test_an_unset_schedule_leaves_the_config_hash_as_it_was() -> None:
    plain = small_config()
    unset = small_config(
        outer_optimizer={"lr": 0.7, "momentum": 0.9, "nesterov": True, "lr_half_life_rounds": None}
    )
    assert config_hash(unset) == config_hash(plain)
    assert config_hash(small_config(outer_optimizer=SCHEDULE)) != config_hash(plain)


def test_a_scheduled_run_records_its_steps_and_differs_from_the_constant_one() -> None:
    coordinator, transport, _ = build(small_config(rounds=4, outer_optimizer=SCHEDULE))
    records = [r for r in coordinator.run(transport).records if r.state == "closed"]
    lrs = [r.defences["outer"]["lr"] for r in records]
    assert lrs == pytest.approx([0.7 * 0.5 ** (v / 2.0) for v in range(4)])
    assert all(r.defences["outer"]["momentum"] == 0.9 for r in records)
    constant, transport2, _ = build(small_config(rounds=4))
    plain = constant.run(transport2).records
    assert all("outer" not in r.defences for r in plain)
    assert committed_chain(records)[0] == committed_chain(plain)[0]  # the first lr is the same
    assert committed_chain(records)[1:] != committed_chain(plain)[1:]


def test_a_resumed_scheduled_run_commits_the_uninterrupted_chain(tmp_path: Path) -> None:
    config = small_config(rounds=4, outer_optimizer=SCHEDULE)
    whole, transport, _ = build(config, output_dir=tmp_path / "whole")
    expected = committed_chain(whole.run(transport).records)
    first, transport1, _ = build(
        small_config(rounds=2, outer_optimizer=SCHEDULE), output_dir=tmp_path / "split"
    )
    first.run(transport1)
    resumed, transport2, _ = build(config, output_dir=tmp_path / "split", resume=True)
    resumed.run(transport2)
    assert committed_chain(resumed.history) == expected
