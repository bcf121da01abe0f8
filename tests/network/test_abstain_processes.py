"""A round lost to a dead rank, over the network: the same ledger and hash chain as in process.

``rank_kill:alpha@1`` reaches alpha's participant process as ``--faults`` (as ``lensemble
simulate --faults`` hands it over the network); the test learner
(``tests.support.federation.RankFailingLearner``) fails that round with ``RankFailure`` without
launching ranks, so the whole run takes seconds. The participant reports it with ``Abstain``;
the coordinator records ``rank_failure`` exactly as the in-process transport does and closes the
round without waiting out ``round_timeout_s``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from lensemble.config import LensembleConfig
from lensemble.config.load import validate_mapping
from lensemble.federation.faults import FaultPlan, parse_faults
from lensemble.federation.inprocess import InProcessTransport
from lensemble.federation.ledger import Ledger, RoundRecord, committed_chain
from lensemble.federation.participant import Participant
from lensemble.network.launch.launcher import ProcessFailed
from lensemble.simulation.local_processes import run_local_processes
from tests.support.federation import RankFailingLearner, build
from tests.support.network import NETPROC, network_mapping

#: Long enough that a round waiting it out would show in its wall time and in the test's.
ROUND_TIMEOUT_S = 120


@dataclass
class _Runs:
    """One fault plan, ready to run over the network and already run in process."""

    path: Path
    config: LensembleConfig
    plan: FaultPlan
    reference: list[RoundRecord]
    transport: InProcessTransport
    participants: dict[str, Participant]


def _runs(tmp_path: Path, rounds: int, faults: str) -> _Runs:
    """Write the network config, and run the same federation and faults in process."""
    mapping = network_mapping(
        tmp_path, rounds=rounds, round_timeout_s=ROUND_TIMEOUT_S, join_timeout_s=ROUND_TIMEOUT_S
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(mapping), encoding="utf-8")
    config = validate_mapping(mapping)
    plan = parse_faults(faults, config.participant_ids)
    in_process = dict(mapping, federation={**mapping["federation"], "transport": "in_process"})
    coordinator, transport, participants = build(
        validate_mapping(in_process), faults=plan, learner=RankFailingLearner
    )
    reference = coordinator.run(transport).records
    return _Runs(path, config, plan, reference, transport, participants)


def test_a_rank_failure_over_the_network_gives_the_in_process_ledger(tmp_path: Path) -> None:
    runs = _runs(tmp_path, 3, "rank_kill:alpha@1")
    path, config, plan, reference = runs.path, runs.config, runs.plan, runs.reference
    assert runs.participants["alpha"].learner.failed_rounds == [1]  # type: ignore[attr-defined]

    result = run_local_processes(
        path, [], config, program=NETPROC, evaluate_final=False, faults=plan
    )
    by_round = {r.round: r for r in result.records if r.state == "closed"}
    assert by_round[1].excluded == {"alpha": "rank_failure"}
    assert by_round[1].contributors == ["bravo", "charlie", "delta"]
    assert by_round[0].excluded == by_round[2].excluded == {}
    # The round closed once the others were judged, not at its deadline.
    assert by_round[1].wall_s < ROUND_TIMEOUT_S / 2
    assert [(r.round, r.attempt, r.state, r.contributors, r.excluded) for r in result.records] == [
        (r.round, r.attempt, r.state, r.contributors, r.excluded) for r in reference
    ]
    assert committed_chain(result.records) == committed_chain(reference)
    assert [r.defences["rejected"] for r in result.records] == [
        r.defences["rejected"] for r in reference
    ]
    log = (Path(config.run.output_dir) / "logs" / "alpha.log").read_text(encoding="utf-8")
    assert '"event": "abstained"' in log


def test_faults_of_the_in_process_transport_are_refused_over_the_network(tmp_path: Path) -> None:
    mapping = network_mapping(tmp_path, rounds=1)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(mapping), encoding="utf-8")
    config = validate_mapping(mapping)
    with pytest.raises(Exception, match="'drop:alpha@0' is injected by the in-process"):
        run_local_processes(path, [], config, program=NETPROC, faults=parse_faults("drop:alpha@0"))


def test_a_rank_group_out_of_restarts_leaves_and_the_run_goes_on(tmp_path: Path) -> None:
    """alpha loses round 1 to a dead rank, then round 2 beyond ``max_restarts`` (1): it leaves.

    In process the participant is recorded ``left`` from round 2 on and the run finishes with
    the other three (quorum 3); over the network alpha's process says ``Leave`` and exits, and
    the coordinator's ledger and hash chain are the in-process ones.
    """
    runs = _runs(tmp_path, 4, "rank_kill:alpha@1,rank_kill:alpha@2")
    path, config, plan, reference = runs.path, runs.config, runs.plan, runs.reference
    assert set(runs.transport.left) == {"alpha"}
    assert [r.state for r in reference] == ["closed"] * 4
    assert reference[1].excluded == {"alpha": "rank_failure"}
    assert reference[2].excluded == reference[3].excluded == {"alpha": "left"}
    assert reference[3].contributors == ["bravo", "charlie", "delta"]
    assert runs.participants["alpha"].learner.failed_rounds == [1, 2]  # type: ignore[attr-defined]

    # alpha's process exits non-zero, and the run fails once it is over, naming alpha.
    with pytest.raises(ProcessFailed, match="participant alpha exited with code 1"):
        run_local_processes(path, [], config, program=NETPROC, evaluate_final=False, faults=plan)
    records = Ledger(Path(config.run.output_dir) / config.observability.ledger_path).records()
    assert [(r.round, r.attempt, r.state, r.contributors, r.excluded) for r in records] == [
        (r.round, r.attempt, r.state, r.contributors, r.excluded) for r in reference
    ]
    assert committed_chain(records) == committed_chain(reference)
    # The rounds after alpha left did not wait for it.
    assert all(r.wall_s < ROUND_TIMEOUT_S / 2 for r in records)
    # alpha said why it left before it exited.
    logs = Path(config.run.output_dir) / "logs"
    assert "alpha left (rank_restarts_exhausted)" in (logs / "coordinator.log").read_text("utf-8")
    assert "more than max_restarts=1" in (logs / "alpha.log").read_text(encoding="utf-8")
