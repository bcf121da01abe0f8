"""Attacks over the real network transport: participant processes attacking themselves.

Issue 36: a defence that only works in process is not one. Each participant process gets the
whole ``--faults`` plan and applies its own entries (``lensemble participant --faults``): delta
flips and scales its update from round 2 (a sleeper), charlie sends ALIE, bravo lies about its
held-out loss. Under the norm bound of before issue 36 (10 x the median norm) the model
diverges; the coordinator process's divergence guard rolls back and names delta, says so in its
log, and the run commits exactly the ledger of the same plan in process (the quadratic test
learner: seconds, not minutes).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lensemble.config.load import validate_mapping
from lensemble.federation.faults import parse_faults
from lensemble.federation.guard import summary
from lensemble.federation.verify import verify_run
from lensemble.simulation.local_processes import run_local_processes
from tests.support.federation import build
from tests.support.network import NETPROC, network_mapping

pytestmark = pytest.mark.e2e

FAULTS = "scaled:delta@2-=-20,alie:charlie@0-,misreport:bravo@0-=0.5"


def test_participant_processes_attack_and_the_guard_rolls_back_as_in_process(
    tmp_path: Path,
) -> None:
    weak = {"median_factor": 10, "max_relative_change": 1e6}
    mapping = network_mapping(tmp_path, rounds=6, round_timeout_s=60, robustness=weak)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(mapping), encoding="utf-8")
    config = validate_mapping(mapping)
    plan = parse_faults(FAULTS, config.participant_ids)
    in_process = dict(mapping, federation={**mapping["federation"], "transport": "in_process"})
    coordinator, transport, _ = build(validate_mapping(in_process), faults=plan)
    reference = coordinator.run(transport).records

    result = run_local_processes(
        path, [], config, program=NETPROC, evaluate_final=False, faults=plan
    )

    def seen(records: list) -> list:  # type: ignore[type-arg]
        return [
            (r.round, r.state, r.contributors, r.model_hash, r.defences["suspicion"], r.guard)
            for r in records
        ]

    assert seen(result.records) == seen(reference)
    said = summary(result.records)
    assert said["rollbacks"] and said["suspects"] == ["delta"]
    assert all(r.self_reported["bravo"]["heldout_loss"] is not None for r in result.records)
    assert verify_run(Path(config.run.output_dir)).first_break is None
    logs = "".join(p.read_text() for p in (Path(config.run.output_dir) / "logs").glob("*"))
    assert "the divergence guard rolled back" in logs
