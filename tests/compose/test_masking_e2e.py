"""Masked rounds on the Compose stack, on a real Docker engine (issue 37).

A coordinator and four participants, each in its own container, run secure aggregation over
mutual TLS: each participant signs with its own key, checks its peers' certificates against the
CA mounted in its container, and sends only its masked vector. The committed hash chain must be
``lensemble simulate``'s in process, bit for bit, and the ledger must show that the coordinator
aggregated masked sums, never an update in clear.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.stack import simulated_chain, stack
from tests.support.tools import require

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_masked_rounds_in_containers_commit_the_simulation_chain(tmp_path: Path) -> None:
    require("docker")
    require("image")
    sets = ["--set", "federation.rounds=3", "--set", "federation.aggregation=masking"]
    with stack(tmp_path, *sets) as up:
        assert up.run({}) == 0, "\n".join(up.lines[-40:])
        ledger = up.ledger
        chain = up.chain
    closed = [r for r in ledger if r["state"] == "closed"]
    assert [r["round"] for r in closed] == [0, 1, 2]
    assert all(r["defences"]["aggregator"] == "masking" for r in closed)
    assert all(
        sorted(r["contributors"]) == ["alpine", "coastal", "delta", "highland"] for r in closed
    )
    assert chain == simulated_chain(tmp_path / "sim", *sets)
