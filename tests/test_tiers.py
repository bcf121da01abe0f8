"""Every test is in exactly one tier, and the unit tier holds nothing slow or engine-bound."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import TIERS, Collected, default_tier


def test_every_collected_test_has_exactly_one_tier(collected_tiers: Collected) -> None:
    assert collected_tiers, "nothing collected"
    wrong = {node: tiers for node, (tiers, _, _) in collected_tiers.items() if len(tiers) != 1}
    assert not wrong, f"tests without exactly one of {TIERS}: {wrong}"


def test_no_unit_test_is_slow_or_needs_an_engine(collected_tiers: Collected) -> None:
    wrong = {
        node: other
        for node, (tiers, _, other) in collected_tiers.items()
        if "unit" in tiers and other
    }
    assert not wrong, f"unit tests marked as needing more than a quick loop has: {wrong}"


def test_unit_tests_live_in_unit_files(collected_tiers: Collected) -> None:
    # ``-m unit`` skips files whose default tier is not unit: a unit test there would never run.
    wrong = [
        node
        for node, (tiers, default, _) in collected_tiers.items()
        if tiers == ("unit",) and default != "unit"
    ]
    assert not wrong, f"unit tests in integration or e2e files (move them): {wrong}"


def test_default_tiers_follow_the_path() -> None:
    tests = Path(__file__).resolve().parent
    assert default_tier(tests / "e2e" / "test_simulate.py") == "e2e"
    assert default_tier(tests / "compose" / "test_stack_e2e.py") == "e2e"
    assert default_tier(tests / "k8s" / "test_chart.py") == "integration"
    assert default_tier(tests / "federation" / "test_rounds.py") == "unit"
    assert default_tier(Path("/elsewhere/test_x.py")) == "unit"
