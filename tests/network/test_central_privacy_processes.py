"""Central differential privacy (DP-FedAvg) over the network, as real processes (issue 38).

Under plain aggregation the coordinator process clips and noises the mean with a seed from its
own TLS key (not the run seed every party knows), stops at its budget and says why; under
masking each participant process adds its share of the noise from its own key, so the sum
carries it. Both runs are signed and ``lensemble verify`` recomputes the spent epsilon.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.simulation.test_central_privacy_run import SHORT_BUDGET, TINY
from tests.support.cli import run_cli

pytestmark = pytest.mark.slow
pytest.importorskip("opacus", reason="needs the [dp] extra (Opacus)")


def _simulate(out: Path, *overrides: str, network: bool) -> dict[str, object]:
    sets = [*TINY, *overrides, *(["federation.transport=network"] if network else [])]
    args = [a for s in sets for a in ("--set", s)]
    done = run_cli("simulate", "config/local.yaml", *args, "-o", str(out), "--json")
    assert done.code == 0, done.err
    summary: dict[str, object] = json.loads(done.out)
    return summary


def _records(out: Path) -> list[dict[str, object]]:
    lines = (out / "ledger.jsonl").read_text().splitlines()
    return [json.loads(line)["record"] for line in lines]


def _central(records: list[dict[str, object]]) -> list[dict[str, object]]:
    return [r["defences"]["central_privacy"] for r in records]  # type: ignore[index]


def _verified(out: Path) -> None:
    done = run_cli("verify", str(out))
    assert done.code == 0, done.out + done.err


def test_the_coordinator_process_noises_the_mean_from_its_own_key_and_stops_at_its_budget(
    tmp_path: Path,
) -> None:
    summary = _simulate(tmp_path / "net", "federation.rounds=3", SHORT_BUDGET, network=True)
    assert "central privacy budget is spent: round 1" in str(summary["stopped"])
    records = _records(tmp_path / "net")
    assert [r["state"] for r in records] == ["closed"]
    (entry,) = _central(records)
    assert entry["releases"] == 1 and 0 < entry["epsilon"] <= 5  # type: ignore[operator]
    assert entry["clipped"]
    _verified(tmp_path / "net")
    # In process the same config seeds the noise from the run seed instead: the same
    # accounting, but other noise, so another model.
    local = _simulate(tmp_path / "in", "federation.rounds=3", SHORT_BUDGET, network=False)
    assert local["stopped"] == summary["stopped"]
    (in_process,) = _records(tmp_path / "in")
    assert _central([in_process]) == [entry]
    assert in_process["model_hash"] != records[0]["model_hash"]


def test_under_masking_the_participant_processes_noise_shares_carry_the_epsilon(
    tmp_path: Path,
) -> None:
    central = "federation.central_privacy={clip_norm: 0.02, noise_multiplier: 1.0}"
    masked = ["federation.aggregation=masking", "federation.quorum=3", "federation.rounds=2"]
    summary = _simulate(tmp_path / "net", *masked, central, network=True)
    assert summary["stopped"] is None
    records = _records(tmp_path / "net")
    assert [r["state"] for r in records] == ["closed"] * 2
    entries = _central(records)
    assert [e["releases"] for e in entries] == [1, 2]
    assert 0 < entries[0]["epsilon"] < entries[1]["epsilon"]  # type: ignore[operator]
    _verified(tmp_path / "net")
    # Each participant draws its share from its own key over the network (from the run seed in
    # process): the same accounting, other noise, so another model.
    local = _simulate(tmp_path / "in", *masked, central, network=False)
    assert local["stopped"] is None
    in_process = _records(tmp_path / "in")
    assert _central(in_process) == entries
    assert in_process[0]["model_hash"] != records[0]["model_hash"]
