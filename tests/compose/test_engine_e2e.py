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
import queue
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lensemble.config import load_config
from tests.conftest import REPO
from tests.support import machine
from tests.support.tools import require

pytestmark = [pytest.mark.docker, pytest.mark.slow]

#: Seconds a whole `lensemble up` run may take on a loaded 2-core machine.
RUN_DEADLINE_S = 900.0
NETWORK = ["--set", "federation.transport=network"]
#: What every run here shares with its in-process reference: less data per site and no
#: baselines (they train in the simulation only and cost minutes); the hash chain still covers
#: all of it, so both sides must be given the same.
LEAN = [
    "--set",
    "data.episodes=8",
    "--set",
    "data.episode_steps=60",
    "--set",
    "evaluation.local_only_baseline=false",
    "--set",
    "evaluation.pooled_oracle=false",
    "--set",
    "evaluation.fedavg_ablation=false",
]
#: The fault runs: rounds long enough (300 inner steps, several seconds under the containers'
#: CPU limits) for a fault fired at a round's opening line to land while participants train,
#: and a round timeout well above that; the hierarchy rpc < round <= join holds.
FAULT_ROUNDS = [
    "--set",
    "federation.inner_steps=300",
    "--set",
    "network.rpc_timeout_s=10",
    "--set",
    "federation.round_timeout_s=45",
]


@pytest.fixture(autouse=True)
def _engine_and_image() -> None:
    require("docker")
    require("image")


def lensemble(*args: str, timeout: float = RUN_DEADLINE_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["lensemble", *args], cwd=REPO, capture_output=True, text=True, check=False, timeout=timeout
    )


def docker(*args: str) -> str:
    done = subprocess.run(
        ["docker", *args], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, f"docker {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def container(project: str, service: str) -> str:
    return docker(
        "ps",
        "-aq",
        "--filter",
        f"label=com.docker.compose.project={project}",
        "--filter",
        f"label=com.docker.compose.service={service}",
    )


def compose_network(project: str, name: str) -> str:
    return docker(
        "network",
        "ls",
        "-q",
        "--filter",
        f"label=com.docker.compose.project={project}",
        "--filter",
        f"label=com.docker.compose.network={name}",
    )


def crash(project: str, service: str) -> None:
    """SIGKILL every process of the container's user from inside: a crash, as by the OOM killer.

    PID 1 (the init process) survives the signal, sees its child die and exits with 137, so the
    restart policy applies.
    """
    docker("exec", container(project, service), "bash", "-c", "kill -KILL -1")


def restarts(project: str, service: str) -> int:
    return int(docker("inspect", "--format", "{{.RestartCount}}", container(project, service)))


@dataclass
class Up:
    """A running `lensemble up`, its output lines and the hooks fired by them."""

    project: str
    stack: Path
    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    _queue: queue.Queue[str | None] = field(default_factory=queue.Queue)

    def pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def run(self, hooks: dict[str, Callable[[], None]]) -> int:
        """Read output to the end, calling each hook once at the first line containing its key."""
        pending = dict(hooks)
        deadline = time.monotonic() + RUN_DEADLINE_S
        while True:
            try:
                line = self._queue.get(timeout=max(deadline - time.monotonic(), 0.1))
            except queue.Empty:
                self.proc.kill()
                pytest.fail("lensemble up did not finish in time:\n" + "\n".join(self.lines[-30:]))
            if line is None:
                break
            self.lines.append(line)
            for key in [k for k in pending if k in line]:
                pending.pop(key)()
        code = self.proc.wait(timeout=60)
        assert not pending, f"never saw {sorted(pending)}:\n" + "\n".join(self.lines[-30:])
        return code

    @property
    def ledger(self) -> list[dict[str, Any]]:
        path = self.stack / "ledger.jsonl"
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [line["record"] for line in lines]  # ledger v2: the round record per line

    @property
    def chain(self) -> list[str]:
        return [r["model_hash"] for r in self.ledger if r["state"] == "closed"]


@contextmanager
def stack(tmp_path: Path, *sets: str) -> Iterator[Up]:
    """`lensemble up` under a fresh run name; always torn down with its volumes afterwards.

    The stack runs while no other test does (:func:`tests.support.machine.alone`).
    """
    with machine.alone(), _stack(tmp_path, *sets) as up:
        yield up


@contextmanager
def _stack(tmp_path: Path, *sets: str) -> Iterator[Up]:
    project = f"lens-e2e-{uuid.uuid4().hex[:6]}"
    stack_dir = tmp_path / "stack"
    args = [
        "lensemble",
        "up",
        "--substrate",
        "compose",
        "--config",
        "config/local.yaml",
        *NETWORK,
        *LEAN,
        "--set",
        f"run.name={project}",
        *sets,
        "--dir",
        str(stack_dir),
    ]
    proc = subprocess.Popen(
        args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    up = Up(project=project, stack=stack_dir, proc=proc)
    reader = threading.Thread(target=up.pump, daemon=True)
    reader.start()
    try:
        yield up
    finally:
        if proc.poll() is None:
            proc.kill()
        lensemble("down", "--dir", str(stack_dir), "--volumes", timeout=300)


def simulated_chain(output: Path, *sets: str, faults: str = "") -> list[str]:
    """The hash chain `lensemble simulate` commits in process for the same config."""
    args = ["simulate", "config/local.yaml", *LEAN, *sets, "--json", "-o", str(output)]
    if faults:
        args += ["--faults", faults]
    done = lensemble(*args)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout.strip().splitlines()[-1])["hash_chain"])


def drops(ledger: list[dict[str, Any]]) -> str:
    """The --faults that exclude the same participants from the same attempts as ``ledger``.

    Aborted attempts count too: a round that lost quorum on the engine (say, one participant
    still restarting and another cut off) is aborted and retried in the simulation as well.
    """
    return ",".join(
        f"drop:{p}@{r['round']}.{r['attempt']}" for r in ledger for p in sorted(r["excluded"])
    )


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
    # A crash breaks the connection (absent at once); a cut link is noticed by keepalive or
    # the round's deadline.
    reasons = {reason for r in closed for reason in r["excluded"].values()}
    assert reasons <= {"timeout", "disconnected"}, ledger
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
