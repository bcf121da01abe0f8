"""The process commands' command lines: certs init, health, serve, identity errors."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lensemble.network.shared.certs import certificate_identities
from lensemble.network.shared.health import HealthServer
from tests.support.cli import run_cli


def test_certs_init_from_the_command_line(tmp_path: Path, in_repo: Path) -> None:
    result = run_cli(
        "certs",
        "init",
        str(tmp_path / "certs"),
        "--config",
        "config/local.yaml",
        "--host",
        "coord.internal",
        "--host",
        "10.0.0.5",
    )
    assert result.code == 0, result.err
    assert "created a development CA" in result.err and "keep" in result.err  # status: stderr
    names = certificate_identities((tmp_path / "certs" / "coordinator" / "tls.crt").read_bytes())
    assert {"coord.internal", "10.0.0.5", "lensemble-local-coordinator"} <= names
    for pid in ("alpine", "coastal", "highland", "delta"):
        assert certificate_identities((tmp_path / "certs" / pid / "tls.crt").read_bytes()) == {pid}
    again = run_cli("certs", "init", str(tmp_path / "certs"), "--config", "config/local.yaml")
    assert again.code == 0 and "reused the CA" in again.err


def test_health_command_exit_codes() -> None:
    server = HealthServer("127.0.0.1", 0)
    try:
        port = str(server.port)
        assert run_cli("health", "--port", port).code == 0
        not_ready = run_cli("health", "--port", port, "--ready")
        assert (
            not_ready.code == 1 and "is not ready: it runs but reports NOT_SERVING" in not_ready.err
        )
        server.set_ready(True)
        assert run_cli("health", "--port", port, "--ready").code == 0
    finally:
        server.stop()
    gone = run_cli("health", "--port", port, "--timeout", "1")
    assert gone.code == 1 and "is not live: nothing answered within" in gone.err


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["serve"], {}, "LENSEMBLE_ROLE is ''"),
        (["serve"], {"LENSEMBLE_ROLE": "observer"}, "LENSEMBLE_ROLE is 'observer'"),
        (["participant", "--id", "nobody"], {}, "--id 'nobody' is not a participant"),
        (
            ["serve"],
            {"LENSEMBLE_ROLE": "participant", "LENSEMBLE_POD_NAME": "site-9"},
            "ordinal 9, but the config has only 4",
        ),
    ],
)
def test_process_commands_refuse_bad_input_with_one_sentence(
    args: list[str],
    env: dict[str, str],
    message: str,
    in_repo: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LENSEMBLE_CONFIG", "config/local.yaml")
    args = [*args, "--set", "federation.transport=network"]
    for key in ("LENSEMBLE_ROLE", "LENSEMBLE_PARTICIPANT_ID", "LENSEMBLE_POD_NAME"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = run_cli(*args)
    assert result.code == 2
    assert message in result.err and "Traceback" not in result.err


def test_missing_tls_files_name_the_field_and_the_fix(tmp_path: Path, in_repo: Path) -> None:
    result = run_cli(
        "participant",
        "--config",
        "config/local.yaml",
        "--id",
        "alpine",
        "--set",
        "federation.transport=network",
        "--set",
        f"network.tls.cert_file={tmp_path}/nope/tls.crt",
        "--set",
        f"run.output_dir={tmp_path}",
        "--health-port",
        "0",
        "--metrics-port",
        "0",
    )
    assert result.code == 2
    assert "network.tls.cert_file" in result.err and "lensemble certs init" in result.err


@pytest.mark.parametrize("taken", ["network.port", "network.download_port"])
def test_a_port_in_use_fails_the_coordinator_before_it_writes_a_checkpoint(
    taken: str, tmp_path: Path, in_repo: Path
) -> None:
    """A failed bind leaves the run folder with nothing to resume from (a field report)."""
    certs, run = tmp_path / "certs", tmp_path / "run"
    assert run_cli("certs", "init", str(certs), "--config", "config/local.yaml").code == 0
    with socket.socket() as holder:  # a plain listener: no SO_REUSEPORT for gRPC to share
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        settings = {
            "federation.transport": "network",
            "run.output_dir": str(run),
            "network.tls.ca_file": str(certs / "ca.crt"),
            "network.tls.cert_file": str(certs / "coordinator" / "tls.crt"),
            "network.tls.key_file": str(certs / "coordinator" / "tls.key"),
            taken: str(holder.getsockname()[1]),
        }
        sets = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
        # The gRPC port is bound first: when the download port is the one taken, gRPC gets a
        # free port (the download port is never reached while the gRPC port fails).
        free_grpc = ["--port", "0"] if taken == "network.download_port" else []
        lensemble = str(Path(sys.executable).with_name("lensemble"))
        process_flags = ["--health-port", "0", "--metrics-port", "0", *free_grpc]
        result = subprocess.run(
            [lensemble, "coordinator", "--config", "config/local.yaml", *process_flags, *sets],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert result.returncode == 2, result.stderr
    assert "cannot listen on" in result.stderr and "Traceback" not in result.stderr
    written = sorted(p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file())
    assert written == ["coordinator/lock"], written
