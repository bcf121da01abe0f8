"""Differential privacy on the Compose stack, on a real engine (issue 38).

A coordinator and four participant containers. One participant trains with DP-SGD, its noise
seeded from its own TLS key, and sits out with ``Abstain`` once its budget is spent: the
coordinator records ``privacy_budget`` and the rounds commit without it. The coordinator
container adds central DP-FedAvg noise to every round's mean, seeded from its own key, and
records the epsilon it has spent.
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
#: Central DP-FedAvg on the plain mean: z C of noise over the kept updates, no budget.
CLIP, Z = 0.05, 0.5
CENTRAL = [
    "--set",
    f"federation.central_privacy={{clip_norm: {CLIP}, noise_multiplier: {Z}}}",
    "--set",
    "federation.robustness.median_factor=null",
]


def test_a_private_participant_sits_out_at_its_budget_and_the_coordinator_noises_the_mean(
    tmp_path: Path,
) -> None:
    require("docker")
    require("image")
    with stack(tmp_path, *PRIVATE, *CENTRAL) as up:
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
    central = [r["defences"]["central_privacy"] for r in closed]
    assert [c["releases"] for c in central] == [1, 2, 3]
    assert 0 < central[0]["epsilon"] < central[1]["epsilon"] < central[2]["epsilon"]
    # The noise is spread over the mean of the kept updates: 4, then 3 without alpine.
    assert [c["noise_std"] for c in central] == [
        pytest.approx(Z * CLIP / len(r["contributors"]), rel=1e-5) for r in closed
    ]
