"""``lensemble simulate``'s worker processes never outlive it: interrupted or killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_simulate import NO_BASELINES

REPO = Path(__file__).resolve().parents[2]

#: Long enough to be stopped mid-run; no baselines (they would only add time).
LONG_RUN = ["--set", "federation.rounds=200", *NO_BASELINES]
#: Seconds any wait here may take before the test fails (a bound on a hang, not a timing).
PATIENCE_S = 120.0


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(out: Path) -> tuple[subprocess.Popen[str], set[int]]:
    """A long simulation with 2 workers, once its third round committed; its descendants."""
    command = [sys.executable, "-c", "from lensemble.cli import main; main()", "simulate"]
    command += ["config/local.yaml", "-o", str(out), "--workers", "2", *LONG_RUN]
    # SIGINT as a terminal sends it: a shell's background job (CI's) starts with it ignored,
    # and Python keeps an ignored SIGINT ignored, so the child gets the default back.
    run = subprocess.Popen(
        command, cwd=REPO, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint
    )
    assert run.stderr is not None
    deadline = time.monotonic() + PATIENCE_S
    for line in run.stderr:
        if line.startswith("round 2 committed") or time.monotonic() > deadline:
            break
    assert run.poll() is None, "the simulation ended before it could be stopped"
    workers = _descendants(run.pid)
    assert len(workers) >= 3, workers  # the fork server and two workers (and more)
    return run, workers


def _wait_gone(pids: set[int]) -> set[int]:
    deadline = time.monotonic() + PATIENCE_S
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return {p for p in pids if _alive(p)}


@pytest.mark.slow
def test_an_interrupted_simulation_exits_130_and_stops_its_workers(tmp_path: Path) -> None:
    run, workers = _start(tmp_path / "run")
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=PATIENCE_S)
    assert run.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    assert _wait_gone(workers) == set()


@pytest.mark.slow
def test_a_killed_simulation_leaves_no_worker_behind(tmp_path: Path) -> None:
    run, workers = _start(tmp_path / "run")
    os.kill(run.pid, signal.SIGKILL)
    run.communicate(timeout=PATIENCE_S)
    assert _wait_gone(workers) == set()
