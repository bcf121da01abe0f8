"""A `lensemble up` Compose stack driven from a test or a bench, and its in-process reference.

:func:`stack` starts ``lensemble up`` on ``config/local.yaml`` over the network transport with
mutual TLS and the cpu profile (a coordinator and four participants, each in its own
container) under a run name of its own, and tears it down with its volumes afterwards.
:meth:`Up.run` follows its output, firing hooks on lines. Faults are injected the way they
happen: :func:`crash` kills every process inside a container (``docker kill`` itself is a
manual stop to Docker, whose restart policy then never restarts the container, so an OOM-style
kill from inside stands in for a crash), and a container's network can be pulled and put back
(:func:`compose_network`). :func:`simulated_chain` is the hash chain ``lensemble simulate``
commits in process for the same config, and :func:`drops` the ``--faults`` that exclude the
same participants from the same attempts as a stack's ledger.

Used by ``tests/compose`` and ``bench/chaos_soak.py``.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support import machine

REPO = Path(__file__).resolve().parents[2]
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

    def run(
        self,
        hooks: dict[str, Callable[[], None]],
        *,
        deadline_s: float = RUN_DEADLINE_S,
        watch: Callable[[str], None] | None = None,
    ) -> int:
        """Read output to the end, calling each hook once at the first line containing its key.

        ``watch``, if given, sees every line first; the run fails after ``deadline_s`` seconds.
        """
        pending = dict(hooks)
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                line = self._queue.get(timeout=max(deadline - time.monotonic(), 0.1))
            except queue.Empty:
                self.proc.kill()
                pytest.fail("lensemble up did not finish in time:\n" + "\n".join(self.lines[-30:]))
            if line is None:
                break
            self.lines.append(line)
            if watch is not None:
                watch(line)
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
def stack(
    tmp_path: Path,
    *sets: str,
    prefix: str = "lens-e2e",
    command: Sequence[str] = ("lensemble",),
) -> Iterator[Up]:
    """`lensemble up` under a fresh run name; always torn down with its volumes afterwards.

    The run name is ``prefix`` and a random suffix; ``command`` is what runs ``up``. The stack
    runs while no other test does (:func:`tests.support.machine.alone`).
    """
    with machine.alone(), _stack(tmp_path, *sets, prefix=prefix, command=command) as up:
        yield up


@contextmanager
def _stack(tmp_path: Path, *sets: str, prefix: str, command: Sequence[str]) -> Iterator[Up]:
    project = f"{prefix}-{uuid.uuid4().hex[:6]}"
    stack_dir = tmp_path / "stack"
    args = [
        *command,
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


def simulated_chain(
    output: Path, *sets: str, faults: str = "", timeout: float = RUN_DEADLINE_S
) -> list[str]:
    """The hash chain `lensemble simulate` commits in process for the same config."""
    args = ["simulate", "config/local.yaml", *LEAN, *sets, "--json", "-o", str(output)]
    if faults:
        args += ["--faults", faults]
    done = lensemble(*args, timeout=timeout)
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
