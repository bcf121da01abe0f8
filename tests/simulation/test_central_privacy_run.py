"""A federation with central user-level differential privacy (DP-FedAvg), run in process.

The coordinator's budget ends the run, and says why; the spent epsilon is in every line and
``lensemble verify`` holds; a rerun commits the same hashes; under masking each participant's
noise share makes the sum private and the run commits with its epsilon recorded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lensemble.cli.run_summary import central_privacy_line
from lensemble.config import load_config
from lensemble.config.schema import LensembleConfig
from lensemble.federation.verify import verify_run
from lensemble.simulation.in_process import run_in_process
from lensemble.simulation.summary import summary
from tests.support.cli import run_cli
from tests.support.small_world import SMALL_WORLD_MODEL

pytestmark = pytest.mark.integration  # three short federated runs

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("opacus", reason="needs the [dp] extra (Opacus)")

TINY = [
    "federation.participant_count=3",
    "federation.quorum=2",
    "federation.rounds=3",
    "federation.inner_steps=3",
    *SMALL_WORLD_MODEL,
    "federation.robustness.median_factor=null",
]
#: z = 1 at delta 1e-5 spends epsilon 4.73 in one round and 7.08 in two (Opacus' RDP
#: accountant, sampling rate 1): a budget of 5 affords exactly one round of the three.
SHORT_BUDGET = "federation.central_privacy={clip_norm: 0.02, noise_multiplier: 1.0, epsilon: 5}"


def _config(out: Path, *overrides: str) -> LensembleConfig:
    return load_config(REPO / "config" / "local.yaml", [*TINY, *overrides, f"run.output_dir={out}"])


def _central(out: Path) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    return [line["record"]["defences"]["central_privacy"] for line in lines]


def test_the_run_stops_at_its_budget_says_why_and_reruns_to_the_same_hashes(
    tmp_path: Path,
) -> None:
    result = run_in_process(_config(tmp_path / "a", SHORT_BUDGET))
    assert [r.state for r in result.records] == ["closed"]
    assert result.stopped is not None
    assert "central privacy budget is spent: round 1" in result.stopped
    assert "federation.central_privacy.epsilon 5" in result.stopped
    (entry,) = _central(tmp_path / "a")
    assert entry["releases"] == 1 and 0 < entry["epsilon"] <= 5  # type: ignore[operator]
    # Every update was clipped to C (their norms are about 0.025 here).
    assert entry["clipped"]
    assert entry["noise_std"] == pytest.approx(1.0 * 0.02 / 3)
    assert verify_run(tmp_path / "a").ok
    # lensemble verify says what the record vouches for: the epsilon it recomputed.
    shown = run_cli("verify", str(tmp_path / "a"))
    assert shown.code == 0, shown.err
    assert f"user-level epsilon {entry['epsilon']:.3g} at delta 1e-05 after 1 release" in shown.out
    assert "(recomputed from every line)" in shown.out
    assert json.loads(run_cli("verify", str(tmp_path / "a"), "--json").out)["privacy"] == entry
    with pytest.MonkeyPatch.context() as no_opacus:  # where the [dp] extra is missing

        def missing(entry: object) -> None:
            raise ImportError("No module named 'opacus'")

        no_opacus.setattr("lensemble.federation.central_privacy.recorded_epsilon_problem", missing)
        unchecked = run_cli("verify", str(tmp_path / "a"))
    assert unchecked.code == 0 and "epsilon not recomputed: install the [dp] extra" in unchecked.out
    # The run's summary says what it spent, in the terminal too.
    spent = summary(result, None)["central_privacy"]
    assert spent == entry
    line = central_privacy_line(spent)
    assert f"user-level epsilon {entry['epsilon']:.3g} at delta 1e-05 after 1 release" in line

    again = run_in_process(_config(tmp_path / "b", SHORT_BUDGET))
    assert [r.model_hash for r in again.records] == [r.model_hash for r in result.records]
    plain = run_in_process(_config(tmp_path / "plain", "federation.rounds=1"))
    assert plain.records[0].model_hash != result.records[0].model_hash  # the noise is in it


def test_under_masking_the_participants_noise_shares_carry_the_epsilon(tmp_path: Path) -> None:
    result = run_in_process(
        _config(
            tmp_path / "m",
            "federation.aggregation=masking",
            "federation.quorum=3",
            "federation.central_privacy={clip_norm: 0.02, noise_multiplier: 1.0}",
        )
    )
    assert [r.state for r in result.records] == ["closed"] * 3
    entries = _central(tmp_path / "m")
    assert [e["releases"] for e in entries] == [1, 2, 3]
    assert entries[0]["epsilon"] < entries[1]["epsilon"] < entries[2]["epsilon"]  # type: ignore[operator]
    # Three survivors of the fewest three: each share is z C / sqrt(3), the mean's std z C / 3.
    assert entries[0]["noise_std"] == pytest.approx(1.0 * 0.02 / 3, rel=1e-5)
    assert verify_run(tmp_path / "m").ok
