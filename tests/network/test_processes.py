"""Coordinator and participants as real processes on loopback (mTLS): crashes and shutdown.

The processes run the production process code (:mod:`lensemble.network.launch.process`) through
``tests.support.netproc`` with the tiny quadratic learner, so rounds take milliseconds and each
test is dominated by process start-up. ``--block-round`` parks a participant inside its training
of one round, which lets a test crash it (or the coordinator) at an exact point, with no timing
guesswork.
"""

from __future__ import annotations

import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from lensemble.config.load import validate_mapping
from lensemble.federation.checkpoint import CheckpointStore
from lensemble.federation.faults import parse_faults
from lensemble.federation.ledger import committed_chain
from lensemble.network.launch.launcher import free_port
from lensemble.network.shared.health import READINESS_SERVICE, check
from tests.support.federation import build
from tests.support.network import chain, federation, ledger, network_mapping, write_config

pytestmark = pytest.mark.slow
START_S = 90.0  # process start-up on a loaded 2-core machine (torch import)


def _wait_for(path: Path, timeout_s: float = START_S) -> None:
    end = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.05)


def _in_process_chain(mapping: dict[str, Any], faults: str = "") -> list[str]:
    in_process = dict(mapping, federation={**mapping["federation"], "transport": "in_process"})
    coordinator, transport, _ = build(validate_mapping(in_process), faults=parse_faults(faults))
    return committed_chain(coordinator.run(transport).records)


def _is(name: str, **fields: Any) -> Any:
    return lambda e: e.get("event") == name and all(e.get(k) == v for k, v in fields.items())


def test_killed_participant_is_excluded_as_disconnected_then_rejoins(tmp_path: Path) -> None:
    # A long round timeout: no round may wait for it (the dead one is absent at once). No
    # straggler cutoff: on a loaded machine it could close alpha's held round 3 without it.
    mapping = network_mapping(
        tmp_path, rounds=5, round_timeout_s=60, join_timeout_s=60, straggler_factor=None
    )
    path, config = write_config(tmp_path, mapping)
    markers = tmp_path / "markers"
    markers.mkdir()
    block = ["--block-round", "1", "--markers", str(markers)]
    with federation(tmp_path, path) as fed:
        # Participants first: they retry with backoff until the coordinator is up. alpha
        # parks in round 3 so that the run is still going when charlie comes back.
        others = [
            fed.start_participant(
                "alpha", extra_args=["--block-round", "3", "--markers", str(markers)]
            ),
            *(fed.start_participant(pid) for pid in ("bravo", "delta")),
        ]
        victim = fed.start_participant("charlie", extra_args=block)
        others[0].wait_event(_is("retry"), START_S)
        coordinator = fed.start_coordinator()
        _wait_for(markers / "charlie-r1.blocked")  # charlie is inside its round-1 training
        victim.popen.kill()
        assert victim.wait(10) == -signal.SIGKILL
        restarted = fed.start_participant("charlie", extra_args=block)  # restarts at once
        closed = coordinator.wait_event(_is("round_closed", round=1), START_S)
        # Its broken connection made it absent at once: the round did not wait for it.
        assert closed["state"] == "closed" and closed["excluded"] == {"charlie": "disconnected"}
        assert restarted.wait_ready(START_S)["participant_id"] == "charlie"
        _wait_for(markers / "alpha-r3.blocked")
        (markers / "alpha-r3.release").touch()
        assert coordinator.wait(START_S) == 0
        assert [p.wait(30) for p in (*others, restarted)] == [0, 0, 0, 0]
    records = ledger(config)
    assert [r.state for r in records] == ["closed"] * 5
    assert records[1].contributors == ["alpha", "bravo", "delta"]
    # Rejoined: it skips the round open when it joins (at most one more), then contributes.
    assert records[-1].contributors == ["alpha", "bravo", "charlie", "delta"]
    # Same chain as an in-process run where charlie is absent from the same rounds.
    absent = [f"drop:{p}@{r.round}" for r in records for p in r.excluded]
    assert all(
        r.excluded[p] in ("disconnected", "joined_late") for r in records for p in r.excluded
    )
    assert chain(config) == _in_process_chain(mapping, ",".join(absent))


def test_coordinator_stopped_then_killed_mid_round_resumes_to_the_uninterrupted_chain(
    tmp_path: Path,
) -> None:
    """SIGTERM, then SIGKILL, of the coordinator mid-round; health, metrics and ready lines."""
    # No straggler cutoff: the held rounds must stay open until the test releases them (on a
    # loaded CI machine the cutoff closed round 1 before the SIGTERM).
    mapping = network_mapping(
        tmp_path, rounds=3, round_timeout_s=60, join_timeout_s=60, straggler_factor=None
    )
    path, config = write_config(tmp_path, mapping)
    markers = tmp_path / "markers"
    markers.mkdir()
    store = CheckpointStore(Path(config.run.output_dir))

    def held(round_index: int) -> list[str]:
        return ["--block-round", str(round_index), "--markers", str(markers)]

    with federation(tmp_path, path) as fed:
        coordinator = fed.start_coordinator()
        participants = {
            "alpha": fed.start_participant("alpha"),
            "bravo": fed.start_participant("bravo", extra_args=held(2)),
            "charlie": fed.start_participant("charlie", extra_args=held(1)),
            "delta": fed.start_participant("delta"),
        }
        ready = coordinator.wait_ready(START_S)
        assert ready["role"] == "coordinator" and ready["participant_id"] is None
        assert ready["endpoint"] == f"127.0.0.1:{config.network.port}"
        assert ready["config_hash"].startswith("sha256-canon-v1:")
        lines = {pid: p.wait_ready(START_S) for pid, p in participants.items()}
        assert all(line["participant_id"] == pid for pid, line in lines.items())
        # The model download port, served and used (issue 41, item 13: no line named it).
        assert ready["download_port"] == config.network.download_port is not None
        assert {line["download_port"] for line in lines.values()} == {ready["download_port"]}
        ports = {ready["health_port"], ready["metrics_port"]}
        ports |= {line[k] for line in lines.values() for k in ("health_port", "metrics_port")}
        assert len(ports) == 10 and 0 not in ports  # --health-port 0 / --metrics-port 0

        # Round 1 is held open: charlie trains forever, the three others are in.
        _wait_for(markers / "charlie-r1.blocked")
        for pid in ("alpha", "bravo", "delta"):
            coordinator.wait_event(_is("verdict", round=1, participant=pid, reason="accepted"), 30)
        assert check("127.0.0.1", ready["health_port"], "", 5) == "SERVING"
        assert check("127.0.0.1", ready["health_port"], READINESS_SERVICE, 5) == "SERVING"
        assert check("127.0.0.1", lines["alpha"]["health_port"], READINESS_SERVICE, 5) == "SERVING"
        metrics = _get(f"http://127.0.0.1:{ready['metrics_port']}/metrics")
        assert "lensemble_participants_joined 4.0" in metrics
        assert 'lensemble_round_state{lensemble_round_state="collecting"} 1.0' in metrics
        assert "lensemble_round_index 1.0" in metrics
        assert "lensemble_accepted_submissions_total 7.0" in metrics
        with pytest.raises(urllib.error.HTTPError):
            _get(f"http://127.0.0.1:{ready['metrics_port']}/other")

        # A participant stopped by SIGTERM leaves; restarted, it is not counted twice.
        participants["alpha"].signal(signal.SIGTERM)
        assert participants["alpha"].wait(30) == 130
        coordinator.wait_event(_is("left", participant="alpha"), 30)
        participants["alpha"] = fed.start_participant("alpha")
        participants["alpha"].wait_ready(START_S)

        # SIGTERM: the coordinator abandons the open round within a bound, committing nothing.
        coordinator.signal(signal.SIGTERM)
        # The bound is the process's own promise: stop within one RPC deadline (plus start-up
        # slack for a loaded machine); wait() raises past it.
        assert coordinator.wait(config.network.rpc_timeout_s + 10) == 130
        assert [r.round for r in ledger(config)] == [0] and store.versions()[-1] == 1

        # Restarted, it resumes from version 1; round 2 is then held and the coordinator killed.
        coordinator = fed.start_coordinator()
        assert coordinator.wait_event(_is("resumed"), START_S)["version"] == 1
        (markers / "charlie-r1.release").touch()
        _wait_for(markers / "bravo-r2.blocked")
        for pid in ("alpha", "charlie", "delta"):
            coordinator.wait_event(_is("verdict", round=2, participant=pid, reason="accepted"), 30)
        coordinator.popen.kill()
        assert coordinator.wait(10) == -signal.SIGKILL
        assert store.versions()[-1] == 2

        coordinator = fed.start_coordinator()
        assert coordinator.wait_event(_is("resumed"), START_S)["version"] == 2
        (markers / "bravo-r2.release").touch()
        assert coordinator.wait(START_S) == 0
        assert [p.wait(30) for p in participants.values()] == [0, 0, 0, 0]
        rejoined = {e["participant"] for e in coordinator.events if e.get("event") == "joined"}
        assert rejoined == {"alpha", "bravo", "charlie", "delta"}
    assert fed.teardowns == 1
    records = ledger(config)
    assert [(r.round, r.state) for r in records] == [(0, "closed"), (1, "closed"), (2, "closed")]
    assert all(r.excluded == {} for r in records)
    # Outer momentum came back with each checkpoint: otherwise rounds 1 and 2 would differ.
    assert chain(config) == _in_process_chain(mapping)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def test_lingering_coordinator_stays_up_and_a_restart_on_a_finished_run_ends_at_once(
    tmp_path: Path,
) -> None:
    mapping = network_mapping(tmp_path, rounds=2)
    path, config = write_config(tmp_path, mapping)
    with federation(tmp_path, path) as fed:
        coordinator = fed.start_coordinator(extra_args=["--linger"])
        participants = [fed.start_participant(p) for p in ("alpha", "bravo", "charlie", "delta")]
        ready = coordinator.wait_ready(START_S)
        coordinator.wait_event(_is("lingering"), START_S)
        assert [p.wait(START_S) for p in participants] == [0, 0, 0, 0]
        # The run is over, yet the process is alive and live (a Deployment would not restart it).
        assert coordinator.popen.poll() is None
        assert check("127.0.0.1", ready["health_port"], "", 5) == "SERVING"
        coordinator.popen.send_signal(signal.SIGTERM)
        assert coordinator.wait(30) == 0
        # Restarted on the finished run with no participant running and an hour to wait for
        # them: it ends at once instead. It listens on new ports: the first one's may have been
        # handed to another process's connection since it closed (CI met that once).
        again = fed.start_coordinator(
            extra_overrides=[
                "federation.join_timeout_s=3600",
                f"network.port={free_port()}",
                f"network.download_port={free_port()}",
            ]
        )
        assert again.wait(START_S) == 0
    assert [r.state for r in ledger(config)] == ["closed", "closed"]
