"""A participant's own differential privacy on the Compose stack, on a real engine (issue 38).

A coordinator and four participant containers; one participant trains with DP-SGD, its noise
seeded from its own TLS key, and sits out with ``Abstain`` once its budget is spent: the
coordinator records ``privacy_budget`` and the rounds commit without it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.stack import stack
from tests.support.tools import require

pytestmark = [pytest.mark.docker, pytest.mark.slow]

#: alpine affords exactly one round (tests/simulation/test_privacy_run.py's budget).
PRIVATE = [
    "--set",
    "federation.rounds=3",
    "--set",
    "federation.inner_steps=3",
    "--set",
    "federation.participants[0].privacy="
    "{epsilon: 1.8, noise_multiplier: 3.0, sample_rate: 0.5, windows_per_record: 2}",
]


def test_a_private_participant_in_a_container_spends_its_budget_then_sits_out(
    tmp_path: Path,
) -> None:
    require("docker")
    require("image")
    with stack(tmp_path, *PRIVATE) as up:
        assert up.run({}) == 0, "\n".join(up.lines[-40:])
        ledger = up.ledger
    closed = [r for r in ledger if r["state"] == "closed"]
    assert [r["round"] for r in closed] == [0, 1, 2]
    assert "alpine" in closed[0]["contributors"]
    assert [r["excluded"].get("alpine") for r in closed] == [
        None,
        "privacy_budget",
        "privacy_budget",
    ]
    assert 0 < closed[0]["self_reported"]["alpine"]["privacy_epsilon"] <= 1.8
