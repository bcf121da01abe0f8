"""The Compose ``monitoring`` profile on a real engine: Prometheus scrapes the running stack.

``lensemble up`` runs the cpu profile of ``config/local.yaml`` (as in ``test_engine_e2e.py``);
once the stack is ready, the test starts the ``prometheus`` service of the same rendered file
(``--profile monitoring``) and asks Prometheus's HTTP API, at one instant while the last round
is open, for the coordinator's committed-rounds counter and every participant target. The
ledger copied after the run must agree with what Prometheus saw.

Needs the engine, the CPU image built from this checkout, and ``lensemble-prometheus:bookworm``
(``deploy/monitoring/Dockerfile``).
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from lensemble.render.prometheus import PROMETHEUS_IMAGE, PROMETHEUS_PORT
from lensemble.stack.engine import compose_command
from tests.compose.test_engine_e2e import FAULT_ROUNDS, Up, container, docker, stack
from tests.support.tools import require

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROUNDS = 4
PARTICIPANTS = ["alpine", "coastal", "delta", "highland"]
#: Longest wait for Prometheus to see what the stack is doing (seconds).
SCRAPE_WAIT_S = 90.0


@pytest.fixture(autouse=True)
def _engine_and_images() -> None:
    require("docker")
    require("image")
    done = subprocess.run(
        ["docker", "image", "inspect", PROMETHEUS_IMAGE], capture_output=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(
            f"{PROMETHEUS_IMAGE} is not on the engine; build it: docker build -t "
            f"{PROMETHEUS_IMAGE} -f deploy/monitoring/Dockerfile deploy/monitoring"
        )


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


def test_prometheus_sees_the_committed_rounds_and_every_participant(tmp_path: Path) -> None:
    rounds = ["--set", f"federation.rounds={ROUNDS}", *FAULT_ROUNDS]
    seen: dict[str, Any] = {}
    with stack(tmp_path, *rounds) as up:
        try:

            def on_ready() -> None:
                seen["prometheus"] = start_prometheus(up)

            def on_last_round() -> None:
                prom: Prometheus = seen["prometheus"]
                last = ROUNDS - 1
                # One instant at which Prometheus had scraped the last round open.
                at = prom.wait(
                    f'lensemble_round_index{{role="coordinator"}} == {last}', "the last round"
                )
                seen["version"] = prom.query('lensemble_model_version{role="coordinator"}', at)
                seen["closed"] = prom.query(
                    'lensemble_rounds_total{role="coordinator",state="closed"}', at
                )
                seen["up"] = prom.query('up{role="participant"}', at)
                seen["coordinator_up"] = prom.query('up{role="coordinator"}', at)
                seen["rules"] = prom.get("/api/v1/rules")

            code = up.run(
                {"following": on_ready, f"round {ROUNDS - 1} attempt 0 open": on_last_round}
            )
            assert code == 0, "\n".join(up.lines[-40:])
            ledger = up.ledger
        finally:
            prometheus = container(up.project, "prometheus")
            if prometheus:
                docker("rm", "-f", prometheus)

    committed_before_last = [
        r for r in ledger if r["state"] == "closed" and r["round"] < ROUNDS - 1
    ]
    # The committed-rounds counter equals the ledger's count at the same moment.
    assert [float(s["value"][1]) for s in seen["version"]] == [len(committed_before_last)]
    assert [float(s["value"][1]) for s in seen["closed"]] == [len(committed_before_last)]
    # Every participant target is up, labelled with its id; so is the coordinator's.
    up_by_participant = {s["metric"]["participant"]: s["value"][1] for s in seen["up"]}
    assert up_by_participant == dict.fromkeys(PARTICIPANTS, "1")
    assert [s["value"][1] for s in seen["coordinator_up"]] == ["1"]
    # The alert rules are loaded (and none is broken).
    rules = [r for g in seen["rules"]["groups"] for r in g["rules"]]
    assert len(rules) >= 8 and all(r["health"] == "ok" for r in rules), rules
    assert sum(1 for r in ledger if r["state"] == "closed") == ROUNDS
