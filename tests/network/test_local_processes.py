"""``lensemble simulate`` as local processes: the launcher and transport parity."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from lensemble.config.load import validate_mapping
from lensemble.federation.ledger import committed_chain
from lensemble.network.launch.launcher import LocalFederation, ProcessFailed
from lensemble.simulation.local_processes import run_local_processes
from tests.support.cli import run_cli
from tests.support.federation import build
from tests.support.network import NETPROC, REPO, network_mapping

pytestmark = pytest.mark.slow
AUDIT_PATH = REPO / "tests" / "support" / "audit"
ROUND_EVENTS = ("round_opened", "verdict", "round_closed")


def test_launcher_issues_credentials_runs_every_process_and_summarises(
    tmp_path: Path, in_repo: Path
) -> None:
    mapping = network_mapping(tmp_path, rounds=2)
    mapping["network"].update(auth="token")
    mapping["network"]["tls"].update(
        client_auth=False, ca_file="missing", cert_file="missing", key_file="missing"
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(mapping), encoding="utf-8")
    config = validate_mapping(mapping)
    closed: list[dict[str, Any]] = []
    result = run_local_processes(
        path, [], config, on_round=closed.append, program=NETPROC, evaluate_final=False
    )
    out = Path(config.run.output_dir)
    in_process = dict(mapping, federation={**mapping["federation"], "transport": "in_process"})
    reference, transport, _ = build(validate_mapping(in_process))
    assert committed_chain(result.records) == committed_chain(reference.run(transport).records)
    assert result.model_hash == committed_chain(result.records)[-1]
    assert [e["round"] for e in closed] == [0, 1]
    assert all(r.bytes_up > 0 and r.bytes_down > 0 for r in result.records)
    # Credentials were issued into the output folder; tokens are private files.
    assert (out / "certs" / "coordinator" / "tls.crt").exists()
    token = out / "certs" / "tokens" / "alpha"
    assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text().strip()) >= 32
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == [0, 1]
    assert {p.name for p in (out / "logs").iterdir()} == {
        f"{i}.log" for i in ("coordinator", "alpha", "bravo", "charlie", "delta")
    }
    # Issue 41, item 7: causal order although commits are written behind; round 1 never
    # opens, nor are its updates judged, before round 0's commit is logged.
    log = [json.loads(line) for line in (out / "logs" / "coordinator.log").read_text().splitlines()]
    order = [(e["event"], e.get("round")) for e in log if e.get("event") in ROUND_EVENTS]
    assert order.index(("round_closed", 0)) < order.index(("round_opened", 1))
    for index, (name, round_index) in enumerate(order):
        if name in ("round_opened", "verdict") and round_index:
            assert ("round_closed", round_index - 1) in order[:index], order


def test_overlapped_rounds_as_processes_commit_the_in_process_chain_and_exit_cleanly(
    tmp_path: Path, in_repo: Path
) -> None:
    # federation.overlap one_round: every participant process trains the next round on a
    # thread while its update travels; none may be left inside torch when it exits (a process
    # that exits so aborts), so every process exits 0 (run_local_processes raises otherwise).
    mapping = network_mapping(
        tmp_path, rounds=3, overlap={"mode": "one_round"}, outer_optimizer={"momentum": 0.0}
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(mapping), encoding="utf-8")
    config = validate_mapping(mapping)
    result = run_local_processes(path, [], config, program=NETPROC, evaluate_final=False)
    in_process = dict(mapping, federation={**mapping["federation"], "transport": "in_process"})
    reference, transport, _ = build(validate_mapping(in_process))
    expected = reference.run(transport).records
    assert committed_chain(result.records) == committed_chain(expected)
    assert [r.defences.get("trained_from") for r in result.records] == [
        r.defences.get("trained_from") for r in expected
    ]
    assert result.records[1].defences["trained_from"] == result.records[0].parent_hash
    logs = Path(config.run.output_dir) / "logs"
    assert not any("terminate called" in log.read_text() for log in logs.iterdir())


def test_a_failing_process_stops_the_run_with_one_sentence(tmp_path: Path) -> None:
    mapping = network_mapping(tmp_path, rounds=1)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(mapping), encoding="utf-8")
    broken = (
        sys.executable,
        "-c",
        "import sys; sys.stderr.write('error: the learner exploded\\n'); sys.exit(3)",
    )
    with pytest.raises(ProcessFailed, match="exited with code 3 before the run started: error: "):
        run_local_processes(path, [], validate_mapping(mapping), program=broken)


def test_simulate_refuses_faults_over_the_network(in_repo: Path) -> None:
    result = run_cli(
        "simulate", "--set", "federation.transport=network", "--faults", "drop:alpine@1"
    )
    assert result.code == 2
    assert "--faults injects faults into the in-process transport only" in result.err
    assert "'drop:alpine@1'" in result.err and "except rank_kill" in result.err
    one_rank = run_cli(
        "simulate", "--set", "federation.transport=network", "--faults", "rank_kill:alpine@1"
    )
    assert one_rank.code == 2
    assert "rank_kill names rank 1 of 'alpine', which has 1 rank(s)" in one_rank.err


def test_network_simulate_commits_the_in_process_chain_of_local_yaml(
    tmp_path: Path, in_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """config/local.yaml, 4 participant processes, TLS on: the same hash chain as in-process.

    Every process runs with the outbound-connection audit: nothing but the coordinator is
    ever contacted (no telemetry, no call-home), by Lensemble or by any library it loads.
    """
    out = tmp_path / "run"
    small = [
        "--rounds",
        "3",
        "-o",
        str(out),
        "--set",
        "federation.inner_steps=5",
        "--set",
        "data.episodes=8",
        "--set",
        "data.episode_steps=40",
    ]
    in_process = run_cli("simulate", "config/local.yaml", *small, "--json")
    assert in_process.code == 0, in_process.err
    expected = json.loads(in_process.out)
    audit = tmp_path / "audit.jsonl"
    imports = [str(AUDIT_PATH), str(REPO), os.environ.get("PYTHONPATH", "")]  # and runtime/
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in imports if p))
    monkeypatch.setenv("LENSEMBLE_AUDIT_FILE", str(audit))
    network = run_cli(
        "simulate",
        "config/local.yaml",
        *small,
        "--set",
        "federation.transport=network",
        "--json",
    )
    assert network.code == 0, network.err
    summary = json.loads(network.out)
    assert summary["hash_chain"] == expected["hash_chain"] and len(summary["hash_chain"]) == 3
    assert summary["model_hash"] == expected["model_hash"]
    assert summary["config_hash"] == expected["config_hash"]
    for key in (
        "federated_union_k_step_error",
        "local_only_mean_union_k_step_error",
        "best_single_site_union_k_step_error",
        "pooled_oracle_union_k_step_error",
        "fedavg_union_k_step_error",
    ):
        assert summary[key] == expected[key] and summary[key] is not None
    assert summary["bytes_up"] == expected["bytes_up"]
    entries = [json.loads(line) for line in audit.read_text().splitlines()]
    assert len({e["pid"] for e in entries}) == 4  # the four participants, nothing else
    # Each dialled the coordinator's gRPC port and its model download port, nothing else.
    start = {"grpc_channel": "'127.0.0.1:", "lookup": "'127.0.0.1'", "connect": "('127.0.0.1', "}
    for entry in entries:
        assert entry["target"].startswith(start[entry["kind"]]), entry
    for kind in start:
        assert len({e["target"] for e in entries if e["kind"] == kind}) == 1, (kind, entries)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_children_die_with_their_launcher_and_teardown_happens_once(tmp_path: Path) -> None:
    sleeper = f"[{sys.executable!r}, '-c', 'import time; time.sleep(120)']"
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from lensemble.network.launch.launcher import LocalFederation\n"
        f"fed = LocalFederation(Path('c.yaml'), [], Path({str(tmp_path)!r}), program={sleeper})\n"
        "print(fed.start_coordinator().popen.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    launcher = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert launcher.stdout is not None
    child = int(launcher.stdout.readline())
    assert _alive(child)
    launcher.kill()  # the launcher crashes: no teardown code runs
    launcher.wait()
    end = time.monotonic() + 20
    while _alive(child):
        assert time.monotonic() < end, "the child outlived its launcher"
        time.sleep(0.05)
    # A normal teardown stops every child, exactly once however often it is asked for.
    fed = LocalFederation(
        Path("c.yaml"), [], tmp_path, program=[sys.executable, "-c", "import time; time.sleep(120)"]
    )
    proc = fed.start_participant("alpha")
    fed.close()
    fed.close()
    with fed:
        pass
    assert fed.teardowns == 1 and proc.returncode is not None


def test_free_ports_lie_below_the_kernels_ephemeral_range() -> None:
    # An outgoing connection (any test's, any process's) takes ports from the ephemeral range:
    # a port picked there could be taken before the child binds it (CI met that twice).
    from lensemble.network.launch.launcher import EPHEMERAL_RANGE_FILE, free_port

    if not EPHEMERAL_RANGE_FILE.exists():
        pytest.skip(f"{EPHEMERAL_RANGE_FILE} is not on this system")
    low = int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(port < low for port in ports) and len(ports) > 1
