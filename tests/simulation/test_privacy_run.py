"""A federation with a participant's differential privacy, run in process end to end.

The participant's own budget stops it: it sits out (``privacy_budget``) and the rounds commit
without it; what it spent is in the ledger; a rerun commits the same hashes.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from lensemble.config import load_config
from lensemble.config.schema import LensembleConfig
from lensemble.federation.messages import PRIVACY_BUDGET
from lensemble.simulation.in_process import run_in_process
from tests.support.small_world import SMALL_WORLD_MODEL

pytestmark = pytest.mark.integration  # short federated runs, seven in all

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("opacus", reason="needs the [dp] extra (Opacus)")

TINY = [
    "federation.participant_count=3",
    "federation.quorum=2",
    "federation.rounds=3",
    "federation.inner_steps=3",
    *SMALL_WORLD_MODEL,
]
#: sigma 3 at q 0.5 and delta 1e-5 spends epsilon 1.45 in a round of 3 steps and 2.02 in two
#: (Opacus' RDP accountant): a budget of 1.8 affords exactly one round.
SHORT_BUDGET = (
    "federation.participants[0].privacy="
    "{epsilon: 1.8, noise_multiplier: 3.0, sample_rate: 0.5, windows_per_record: 2}"
)


def _config(out: Path, *overrides: str) -> LensembleConfig:
    return load_config(REPO / "config" / "local.yaml", [*TINY, *overrides, f"run.output_dir={out}"])


def _ledger(out: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]


def test_a_participant_out_of_budget_sits_out_and_the_rounds_commit_without_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = _config(tmp_path / "a", SHORT_BUDGET)
    private = config.federation.participants[0].id
    with caplog.at_level(logging.WARNING, logger="lensemble.federation.inprocess"):
        result = run_in_process(config)
    records = result.records
    assert [r.state for r in records] == ["closed"] * 3
    assert private in records[0].contributors
    assert [r.excluded.get(private) for r in records] == [None, PRIVACY_BUDGET, PRIVACY_BUDGET]
    assert all(private not in r.contributors for r in records[1:])
    said = [r.getMessage() for r in caplog.records if "sits out" in r.getMessage()]
    assert len(said) == 1 and f"participant '{private}' sits out round 1" in said[0]
    # What it spent is self-reported in the ledger, and within its budget.
    spent = _ledger(tmp_path / "a")[0]["record"]["self_reported"][private]["privacy_epsilon"]  # type: ignore[index]
    assert 0 < spent <= 1.8
    others = [p for p in config.participant_ids if p != private]
    assert all("privacy_epsilon" not in records[0].self_reported[p] for p in others)

    # A rerun with the same secrets (derived from the run seed) commits the same hashes.
    again = run_in_process(_config(tmp_path / "b", SHORT_BUDGET))
    assert [r.model_hash for r in again.records] == [r.model_hash for r in records]


def test_a_private_participant_changes_the_chain(tmp_path: Path) -> None:
    plain = run_in_process(_config(tmp_path / "plain"))
    private = run_in_process(
        _config(tmp_path / "dp", "federation.participants[0].privacy={epsilon: 50}")
    )
    assert [r.state for r in private.records] == ["closed"] * 3
    assert all(len(r.contributors) == 3 for r in private.records)  # 50 affords every round
    assert plain.records[0].model_hash != private.records[0].model_hash


def test_the_spend_survives_a_resume(tmp_path: Path) -> None:
    # sigma 3, q 0.5: two rounds of 3 steps spend 2.02, three 2.47: a budget of 2.2 affords two.
    own = (
        "federation.participants[0].privacy="
        "{epsilon: 2.2, noise_multiplier: 3.0, sample_rate: 0.5, windows_per_record: 2}"
    )
    straight = run_in_process(_config(tmp_path / "straight", own, "federation.rounds=4"))
    run_in_process(_config(tmp_path / "split", own, "federation.rounds=2"))
    resumed = run_in_process(_config(tmp_path / "split", own, "federation.rounds=4"), resume=True)
    private = straight.records[0].contributors[0]
    assert [r.excluded.get(private) for r in straight.records] == [None, None] + [
        PRIVACY_BUDGET
    ] * 2
    assert [r.model_hash for r in resumed.records] == [r.model_hash for r in straight.records]
    assert [r.excluded for r in resumed.records] == [r.excluded for r in straight.records]
