"""Masked rounds with the coordinator and every participant as real processes (mTLS, loopback).

The processes run the production process code through ``tests.support.netproc`` (the tiny
quadratic learner). A masked run commits the global models of its in-process simulation bit for
bit. A participant killed at any stage after advertising its keys (``--die-at STAGE@R``: the
process exits without a goodbye when the coordinator sends it that stage's message) costs at most
its own contribution: the round commits with the survivors, the ledger names the dead one, and
the sum (so the model) is the survivors' alone, or everyone's when its masked vector arrived
before it died.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lensemble.config.load import validate_mapping
from lensemble.federation.faults import parse_faults
from lensemble.federation.ledger import committed_chain
from tests.support.federation import build
from tests.support.netproc import DIED
from tests.support.network import federation, ledger, network_mapping, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

START_S = 90.0  # process start-up on a loaded 2-core machine (torch import)


def _in_process_chain(mapping: dict[str, Any], faults: str = "") -> list[str]:
    in_process = dict(mapping, federation={**mapping["federation"], "transport": "in_process"})
    coordinator, transport, _ = build(validate_mapping(in_process), faults=parse_faults(faults))
    return committed_chain(coordinator.run(transport).records)


def _mapping(tmp: Path, rounds: int) -> dict[str, Any]:
    mapping = network_mapping(tmp, aggregation="masking", rounds=rounds, round_timeout_s=60)
    mapping["network"].update(rpc_timeout_s=2, keepalive_s=1, liveness_timeout_s=2.5)
    return mapping


def test_masked_processes_commit_the_in_process_chain(tmp_path: Path) -> None:
    mapping = _mapping(tmp_path, rounds=3)
    path, config = write_config(tmp_path, mapping)
    with federation(tmp_path, path) as fed:
        participants = [fed.start_participant(pid) for pid in config.participant_ids]
        coordinator = fed.start_coordinator()
        assert coordinator.wait(START_S * 2) == 0
        assert [p.wait(30) for p in participants] == [0, 0, 0, 0]
    records = ledger(config)
    assert [r.contributors for r in records] == [sorted(config.participant_ids)] * 3
    assert committed_chain(records) == _in_process_chain(mapping)


@pytest.mark.parametrize(
    ("stage", "counted"),
    [
        ("share", False),  # advertised its keys, never shared: not in the sum
        ("mask", False),  # shared its keys, never sent its masked vector: not in the sum
        ("consistency", True),  # its masked vector arrived: its self-mask is removed, it counts
        ("unmask", True),  # signed the survivor set, died before revealing: t others suffice
    ],
)
def test_a_participant_killed_at_a_stage_leaves_the_round_to_the_survivors(
    tmp_path: Path, stage: str, counted: bool
) -> None:
    mapping = _mapping(tmp_path, rounds=2)
    path, config = write_config(tmp_path, mapping)
    with federation(tmp_path, path) as fed:
        others = [fed.start_participant(pid) for pid in ("alpha", "bravo", "delta")]
        victim = fed.start_participant("charlie", extra_args=["--die-at", f"{stage}@1"])
        coordinator = fed.start_coordinator()
        assert victim.wait(START_S * 2) == DIED
        assert coordinator.wait(START_S) == 0
        assert [p.wait(30) for p in others] == [0, 0, 0]
    last = ledger(config)[-1]
    assert (last.round, last.state) == (1, "closed")
    (group,) = last.defences["masking"]["groups"]
    assert "charlie" in group["advertised"]
    if counted:
        assert last.contributors == ["alpha", "bravo", "charlie", "delta"]
        assert "charlie" in group["survivors"]
        assert committed_chain(ledger(config)) == _in_process_chain(mapping)
    else:
        assert last.contributors == ["alpha", "bravo", "delta"]
        assert last.excluded == {"charlie": "masking_dropped"}
        # The sum is the survivors' alone: the model of a round charlie sat out.
        assert committed_chain(ledger(config)) == _in_process_chain(mapping, "drop:charlie@1")
