"""The Compose stack on a real Docker engine: parity with the simulation, and faults.

Each test runs ``lensemble up`` on ``config/local.yaml`` over the network transport with mutual
TLS and the cpu profile (a coordinator and four participants, each in its own container), under
a run name of its own so tests never share containers or volumes. The committed hash chain is
compared bit for bit with ``lensemble simulate`` of the same config, in process.

Needs the engine and the CPU image built from this checkout (``lensemble image build``; the
``image`` tool of ``tests.support.tools``). Faults are injected the way they happen: a process
killed inside its container (``docker kill`` itself is a manual stop to Docker, whose restart
policy then never restarts the container, so an OOM-style kill from inside stands in for a
crash), and a container's network pulled and put back.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from lensemble.config import load_config
from tests.conftest import REPO
from tests.support.stack import (
    FAULT_ROUNDS,
    compose_network,
    container,
    crash,
    docker,
    drops,
    lensemble,
    restarts,
    simulated_chain,
    stack,
)
from tests.support.tools import require

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _engine_and_image() -> None:
    require("docker")
    require("image")


def test_up_runs_to_completion_and_commits_the_simulation_chain(tmp_path: Path) -> None:
    rounds = ["--set", "federation.rounds=3"]
    with stack(tmp_path, *rounds) as up:
        assert up.run({}) == 0, "\n".join(up.lines)
        ready = [line for line in up.lines if line.startswith("ready: ")]
        assert len(ready) == 5, up.lines
        # Every container turned healthy before it counted as ready (or had finished cleanly).
        assert all(line.endswith((", healthy", ", exited")) for line in ready), ready
        assert any(line.endswith(", healthy") for line in ready)
        assert [r["state"] for r in up.ledger] == ["closed"] * 3
        assert all(r["excluded"] == {} for r in up.ledger)
        chain = up.chain
        assert f"final model {chain[-1]} after 3 committed rounds" in up.lines[-1]
        # Every model went over the download port, between containers: nobody fell back.
        for pid in load_config(REPO / "config/local.yaml").participant_ids:
            logs = subprocess.run(
                ["docker", "logs", container(up.project, f"participant-{pid}")],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            said = logs.stdout + logs.stderr
            assert logs.returncode == 0 and "joined the coordinator" in said, said[-2000:]
            assert "did not serve the model" not in said, said[-2000:]

        # down removes what up created, once; the volumes stay unless --volumes.
        down = lensemble("down", "--dir", str(up.stack))
        assert down.returncode == 0 and "torn down" in down.stdout, down.stderr
        assert container(up.project, "coordinator") == ""
        volumes = docker(
            "volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={up.project}"
        )
        assert f"{up.project}_coordinator-state" in volumes.split()
        again = lensemble("down", "--dir", str(up.stack))
        assert again.returncode == 0 and "nothing to tear down" in again.stdout
    for volume in volumes.split():
        docker("volume", "rm", volume)
    # The in-process reference runs once the stack is gone, beside other tests.
    assert chain == simulated_chain(tmp_path / "sim", *rounds)


def test_a_crashed_participant_restarts_and_a_cut_network_rejoins(tmp_path: Path) -> None:
    # A short reconnect backoff: once its link is mended, coastal comes back within a round.
    rounds = ["--set", "federation.rounds=7", "--set", "network.connect_backoff_max_s=1"]
    rounds += FAULT_ROUNDS
    with stack(tmp_path, *rounds) as up:
        project = up.project

        def cut() -> None:
            net = compose_network(project, "net-coastal")
            docker("network", "disconnect", net, container(project, "participant-coastal"))

        def mend() -> None:
            net = compose_network(project, "net-coastal")
            docker("network", "connect", net, container(project, "participant-coastal"))

        code = up.run(
            {
                "round 1 attempt 0 open": lambda: crash(project, "participant-alpine"),
                "round 3 attempt 0 open": cut,
                "round 4 attempt 0 open": mend,
            }
        )
        assert code == 0, "\n".join(up.lines[-40:])
        assert restarts(project, "participant-alpine") >= 1
        ledger = up.ledger
        coastal = subprocess.run(
            ["docker", "logs", container(project, "participant-coastal")],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    closed = [r for r in ledger if r["state"] == "closed"]
    assert [r["round"] for r in closed] == list(range(7))
    # Nothing is counted twice, and the quorum of 3 carried every round.
    assert all(len(set(r["contributors"])) == len(r["contributors"]) >= 3 for r in closed)
    # The crashed participant rejoined and contributes again after its restart.
    assert "alpine" in closed[-1]["contributors"]
    # Cut off, coastal missed at least one round; once mended it reached the coordinator again.
    # (Rounds no longer wait for an absent participant, so the run may end before it gets
    # another round to contribute to: its log, not the ledger, shows that it came back.)
    missed = [r["round"] for r in closed if "coastal" in r["excluded"]]
    assert missed and min(missed) >= 3, ledger
    events = [
        json.loads(line)
        for line in (coastal.stdout + coastal.stderr).splitlines()
        if line.startswith("{")
    ]
    retries = [i for i, e in enumerate(events) if e.get("event") == "retry"]
    assert retries, "coastal should have noticed the cut"
    after = [e.get("event") for e in events[retries[-1] + 1 :]]
    contributed_again = any(
        "coastal" in r["contributors"] for r in closed if r["round"] > max(missed)
    )
    assert contributed_again or "reconnected" in after, after
    # A crash breaks the connection (absent at once); a cut link is noticed by keepalive, by
    # the round's deadline, or by the straggler cutoff once the quorum has submitted (which of
    # them comes first depends on the machine's load).
    reasons = {reason for r in closed for reason in r["excluded"].values()}
    assert reasons <= {"timeout", "disconnected", "straggler"}, ledger
    # The same chain as the simulation with the same exclusions.
    assert [r["model_hash"] for r in closed] == simulated_chain(
        tmp_path / "sim", *rounds, faults=drops(ledger)
    )


def test_a_crashed_coordinator_resumes_from_its_volume(tmp_path: Path) -> None:
    rounds = ["--set", "federation.rounds=4", *FAULT_ROUNDS]
    with stack(tmp_path, *rounds) as up:
        code = up.run({"round 2 attempt 0 open": lambda: crash(up.project, "coordinator")})
        assert code == 0, "\n".join(up.lines[-40:])
        assert restarts(up.project, "coordinator") >= 1
        ledger = up.ledger
        chain = up.chain
    assert [r["round"] for r in ledger if r["state"] == "closed"] == [0, 1, 2, 3]
    assert chain == simulated_chain(tmp_path / "sim", *rounds, faults=drops(ledger))
