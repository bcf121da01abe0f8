"""The Compose ``monitoring`` profile on a real engine: Prometheus scrapes the running stack.

``lensemble up`` runs the cpu profile of ``config/local.yaml`` (as in ``test_engine_e2e.py``);
once the stack is ready, the test starts the ``prometheus`` service of the same rendered file
(``--profile monitoring``) and asks Prometheus's HTTP API whether every participant target is
up. After the run, every sample Prometheus scraped of the coordinator's committed-rounds
counter must equal the ledger's count of committed rounds at that sample's time (the commit
times are those of the coordinator's ``round_closed`` log events).

Needs the engine, the CPU image built from this checkout, and ``lensemble-prometheus:bookworm``
(``image/prometheus/Dockerfile``).
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from lensemble.render.prometheus import PROMETHEUS_PORT
from lensemble.stack.engine import compose_command
from tests.support.stack import Up, container, docker, stack
from tests.support.tools import require

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROUNDS = 8
#: Rounds long enough for several scrapes (every 5 s) during the run, and a round timeout that
#: a loaded 2-core machine does not reach. Rounds close as soon as everyone has submitted: 600
#: inner steps (2-3 s a round on a quiet machine) once left a single scrape at least
#: ``AMBIGUOUS_S`` from a commit; 1,500 steps (about 6 s) leave several.
ROUND_SETS = ["--set", "federation.inner_steps=1500", "--set", "federation.round_timeout_s=180"]
#: A sample scraped this close to a commit (seconds) may show either count.
AMBIGUOUS_S = 0.5
PARTICIPANTS = ["alpine", "coastal", "delta", "highland"]
#: Longest wait for Prometheus to see what the stack is doing (seconds): participants start
#: after the coordinator is healthy, which takes minutes on a loaded 2-core machine (300 s was
#: not enough at a load average of 7-8 in a walkthrough; the wait ends as soon as it is seen).
SCRAPE_WAIT_S = 600.0


@pytest.fixture(autouse=True)
def _engine_and_images() -> None:
    require("docker")
    require("image")
    require("prometheus-image")


class Prometheus:
    """Prometheus's HTTP API at a base URL."""

    def __init__(self, base: str) -> None:
        self.base = base

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/query", query=expr, time=f"{at:.3f}")["result"])

    def wait(self, expr: str, what: str) -> float:
        """Poll until ``expr`` has a result; the evaluation time of that result."""
        deadline = time.monotonic() + SCRAPE_WAIT_S
        while time.monotonic() < deadline:
            try:
                now = time.time()
                if self.query(expr, now):
                    return now
            except OSError:
                pass  # not listening yet
            time.sleep(1.0)
        pytest.fail(f"Prometheus never saw {what} ({expr}) within {SCRAPE_WAIT_S:.0f} s")


def start_prometheus(up: Up) -> Prometheus:
    """Start the monitoring profile's Prometheus in the stack's project; its API."""
    done = subprocess.run(
        [
            *compose_command(),
            "-p",
            up.project,
            "-f",
            str(up.stack / "compose.yaml"),
            "--profile",
            "monitoring",
            "up",
            "-d",
            "--no-deps",
            "prometheus",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    address = docker("port", container(up.project, "prometheus"), f"{PROMETHEUS_PORT}/tcp")
    return Prometheus(f"http://{address.splitlines()[0]}")


def commit_times(project: str) -> list[tuple[float, int]]:
    """``(unix time, round)`` of every committed round, from the coordinator's JSON logs."""
    done = subprocess.run(
        ["docker", "logs", container(project, "coordinator")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    commits = []
    for line in (done.stdout + done.stderr).splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("event") == "round_closed" and record.get("state") == "closed":
            when = datetime.strptime(record["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
            commits.append((when.timestamp(), int(record["round"])))
    return commits


def test_prometheus_sees_the_committed_rounds_and_every_participant(tmp_path: Path) -> None:
    rounds = ["--set", f"federation.rounds={ROUNDS}", *ROUND_SETS]
    seen: dict[str, Any] = {}
    with stack(tmp_path, *rounds) as up:
        try:

            def on_ready() -> None:
                prom = seen["prometheus"] = start_prometheus(up)
                # Every participant's target is up at one instant while the run goes on.
                every = f'count(up{{role="participant"}} == 1) == {len(PARTICIPANTS)}'
                at = prom.wait(every, "every participant target up")
                seen["up"] = prom.query('up{role="participant"}', at)
                seen["coordinator_up"] = prom.query('up{role="coordinator"}', at)
                seen["rules"] = prom.get("/api/v1/rules")

            # Started as soon as the stack's networks exist, so it sees the whole run.
            code = up.run({"containers in": on_ready})
            assert code == 0, "\n".join(up.lines[-40:])
            ledger = up.ledger
            commits = commit_times(up.project)
            prom: Prometheus = seen["prometheus"]
            # Every raw sample of the counter, with its scrape time.
            (series,) = prom.query('lensemble_model_version{role="coordinator"}[2h]', time.time())
        finally:
            prometheus = container(up.project, "prometheus")
            if prometheus:
                docker("rm", "-f", prometheus)

    closed = sorted(r["round"] for r in ledger if r["state"] == "closed")
    assert closed == list(range(ROUNDS))
    assert sorted(r for _, r in commits) == closed  # the log events are the ledger's commits
    compared = []
    for at, value in series["values"]:
        at = float(at)
        if any(abs(at - t) < AMBIGUOUS_S for t, _ in commits):
            continue  # scraped in the instant of a commit: either count is right
        count = sum(1 for t, _ in commits if t < at)
        assert float(value) == count, (at, value, commits)
        compared.append(count)
    # The counter was seen at several ledger counts, not only at the start.
    assert len(compared) >= 3 and len(set(compared)) >= 2, (compared, commits)
    # Every participant target was up, labelled with its id; so was the coordinator's.
    up_by_participant = {s["metric"]["participant"]: s["value"][1] for s in seen["up"]}
    assert up_by_participant == dict.fromkeys(PARTICIPANTS, "1")
    assert [s["value"][1] for s in seen["coordinator_up"]] == ["1"]
    # The alert rules are loaded (and none is broken).
    rules = [r for g in seen["rules"]["groups"] for r in g["rules"]]
    assert len(rules) >= 8 and all(r["health"] == "ok" for r in rules), rules
