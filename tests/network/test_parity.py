"""Parity: the in-process and gRPC transports run the same fault schedule to the same ledger.

Every (round, attempt) admission rule lives in the coordinator
(``lensemble.federation.admission.admit_attempt``), so no transport may count an update that
another refuses. Each schedule runs once in process and once over gRPC with mTLS (participants
in threads, faults applied by ``tests.support.faulty_network``); the committed hash chains, every
attempt's contributors and exclusion reasons, and how the run ended must be equal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lensemble.config import LensembleConfig
from lensemble.config.load import validate_mapping
from lensemble.errors import LensembleError
from lensemble.federation.faults import parse_faults
from lensemble.federation.ledger import RoundRecord
from tests.support.faulty_network import run_over_grpc
from tests.support.federation import build
from tests.support.network import network_mapping, write_config

pytestmark = pytest.mark.slow

#: (fault schedule, federation overrides); rounds are 0-based, quorum is 3 of 4.
SCHEDULES = [
    pytest.param(
        # Issue 15: round 1's attempt-0 updates arrive late, during attempt 1.
        "delay:alpha@1,delay:charlie@1,delay:delta@1",
        {"rounds": 2, "max_round_retries": 1},
        id="stale-attempt-updates-every-attempt",
    ),
    pytest.param(
        "delay:alpha@1.0,delay:charlie@1.0",
        {"rounds": 2},
        id="late-updates-of-an-aborted-attempt",
    ),
    pytest.param(
        "drop:bravo@0,corrupt:charlie@1,duplicate:delta@1,reorder@1,delay:alpha@2=1",
        {"rounds": 3},
        id="drop-corrupt-duplicate-reorder-in-time-delay",
    ),
    pytest.param(
        "delay:delta@0,drop:alpha@1.0,drop:bravo@1.0,duplicate:charlie@1.1",
        {"rounds": 2},
        id="late-into-the-next-round-then-abort-and-retry",
    ),
    pytest.param(
        # Issue 36: participants attacking themselves (a sleeper flipping its update from
        # round 2, ALIE from the start, a liar about its held-out loss) under the norm bound
        # of before (10 x the median): the model diverges, the guard rolls back and names
        # delta, and a participant is dropped meanwhile. Both transports commit the same chain.
        "scaled:delta@2-=-20,alie:charlie@0-,misreport:bravo@0-=0.5,drop:alpha@4",
        {"rounds": 7, "robustness": {"median_factor": 10, "max_relative_change": 1e6}},
        id="attacks-a-liar-and-rollbacks",
    ),
    pytest.param(
        # Issue 39: the best reported version (federation.final_model) from the kept
        # contributors' median reports, a liar reporting 0 and a participant dropped among them.
        "misreport:bravo@0-=0,drop:alpha@2",
        {"rounds": 5, "final_model": "best_reported"},
        id="best-reported-version-with-a-liar",
    ),
    pytest.param(
        # Issue 40: overlapped rounds (federation.overlap one_round); over the network each
        # participant trains the next round while its update travels. bravo misses round 0, so
        # it holds no base for round 1 (no_base_model); charlie's round-1 update is corrupted,
        # so round 2 trains from the held model alone; a late arrival in round 3.
        "drop:bravo@0,corrupt:charlie@1,delay:alpha@3=1",
        {"rounds": 4, "overlap": {"mode": "one_round"}, "outer_optimizer": {"momentum": 0.0}},
        id="overlapped-rounds-a-missing-base-and-a-corrupt-update",
    ),
    pytest.param(
        # Issue 40: a rollback under overlap; the round after it trains from the restored model.
        "scaled:delta@2-=-20,alie:charlie@0-,drop:alpha@4",
        {
            "rounds": 7,
            "overlap": {"mode": "one_round"},
            "outer_optimizer": {"momentum": 0.0},
            "robustness": {"median_factor": 10, "max_relative_change": 1e6},
        },
        id="overlapped-rounds-attacks-and-rollbacks",
    ),
]


def _outcome(records: list[RoundRecord], error: BaseException | None) -> dict[str, Any]:
    return {
        "attempts": [
            (r.round, r.attempt, r.state, r.contributors, r.excluded, r.parent_hash, r.model_hash)
            for r in records
        ],
        # What the defences decided from the history: suspicion scores, the guard's verdicts.
        "defences": [(r.defences.get("suspicion"), r.guard) for r in records],
        # The scoring of each version behind federation.final_model (None under "last").
        "best_reported": [r.defences.get("best_reported") for r in records],
        "error": type(error).__name__ if error is not None else None,
    }


def _in_process(config: LensembleConfig, faults: str, out: Path) -> dict[str, Any]:
    coordinator, transport, _ = build(config, faults=parse_faults(faults), output_dir=out)
    error: LensembleError | None = None
    try:
        coordinator.run(transport)
    except LensembleError as exc:
        error = exc
    return _outcome(coordinator.records, error)


def _network(config: LensembleConfig, faults: str, out: Path) -> dict[str, Any]:
    run = run_over_grpc(config, parse_faults(faults), out)
    assert run.participant_errors() == [], run.participant_errors()
    return _outcome(run.records, run.error)


@pytest.mark.parametrize(("faults", "federation"), SCHEDULES)
def test_both_transports_commit_the_same_ledger_under_faults(
    tmp_path: Path, faults: str, federation: dict[str, Any]
) -> None:
    mapping = network_mapping(tmp_path, round_timeout_s=3, **federation)
    mapping["network"]["rpc_timeout_s"] = 2
    # Liveness must be noticed within the 3 s rounds (network.liveness_timeout_s rules).
    mapping["network"].update(keepalive_s=1, liveness_timeout_s=2.5)
    _, network_config = write_config(tmp_path, mapping)
    in_process_mapping = dict(
        mapping, federation={**mapping["federation"], "transport": "in_process"}
    )
    in_process = _in_process(validate_mapping(in_process_mapping), faults, tmp_path / "in-process")
    network = _network(network_config, faults, tmp_path / "network")
    assert network == in_process
    # Each schedule does exclude someone (the comparison is not between two clean runs).
    assert any(excluded for _, _, _, _, excluded, _, _ in in_process["attempts"])
    if federation.get("final_model") == "best_reported":  # every committed line scores
        assert all(entry for entry in in_process["best_reported"])
    if federation.get("overlap") and "drop:bravo@0" in faults:  # no base for round 1
        assert in_process["attempts"][1][4].get("bravo") == "no_base_model"
    if "scaled" in faults:  # and the attack schedule does make the guard act
        assert any(guard.get("action") == "rollback" for _, guard in in_process["defences"])
