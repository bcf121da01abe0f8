"""Issue 41, item 3: ``-o -`` is stdout, a stream is written as one text, status goes to stderr.

Before the fix ``lensemble render compose -o -`` created a file named ``-``, ``-o /dev/stdout``
wrote the container config into ``/dev``, and the ``wrote ...`` status line went to stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.support.cli import run_cli

MAIN = "import sys; from lensemble.cli import main; sys.argv[0] = 'lensemble'; main()"
NETWORK = ("--config", str(REPO / "config/local.yaml"), "--set", "federation.transport=network")


@pytest.mark.parametrize(
    ("command", "parse"),
    [
        (("config", "schema"), json.loads),
        (("config", "reference"), lambda text: text.startswith("#") or text),
        (("render", "helm-values", "--config", str(REPO / "config/staging.yaml")), yaml.safe_load),
        (("render", "compose", *NETWORK), yaml.safe_load),
    ],
    ids=["config-schema", "config-reference", "helm-values", "compose"],
)
def test_dash_is_stdout_and_creates_no_file(
    command: tuple[str, ...], parse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    result = run_cli(*command, "-o", "-")
    assert result.code == 0, result.err
    assert parse(result.out)
    assert "wrote" not in result.out
    assert list(tmp_path.iterdir()) == []  # no file named '-', no lensemble.yaml


def test_compose_status_goes_to_stderr(tmp_path: Path) -> None:
    out = tmp_path / "compose.yaml"
    result = run_cli("render", "compose", *NETWORK, "-o", str(out))
    assert result.code == 0, result.err
    assert result.out == ""
    # Every file it wrote is named: the Compose file, the config, Prometheus's two files.
    named = [out, *(tmp_path / name for name in ("lensemble.yaml", "prometheus.yml"))]
    assert f"wrote {', '.join(map(str, named))} and {tmp_path / 'alerts.yaml'}" in result.err


def test_certs_init_reports_on_stderr(tmp_path: Path) -> None:
    result = run_cli("certs", "init", str(tmp_path / "certs"), "--config", NETWORK[1])
    assert result.code == 0, result.err
    assert result.out == ""
    assert "created a development CA" in result.err


@pytest.mark.parametrize(
    "command",
    [
        ("simulate", "-o", "-"),
        ("certs", "init", "-", "--config", NETWORK[1]),
    ],
    ids=["simulate", "certs-init"],
)
def test_folder_options_refuse_a_stream(
    command: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = run_cli(*command)
    assert result.code == 2
    assert "names a stream" in result.err
    assert list(tmp_path.iterdir()) == []


def test_dev_stdout_is_written_as_a_stream_and_nothing_lands_in_dev(tmp_path: Path) -> None:
    # A real process: /dev/stdout is its file descriptor 1, which a captured run cannot offer.
    env = {**os.environ, "PYTHONPATH": str(REPO / "runtime")}
    before = set(os.listdir("/dev"))
    proc = subprocess.run(
        [sys.executable, "-c", MAIN, "render", "compose", *NETWORK, "-o", "/dev/stdout"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "coordinator" in yaml.safe_load(proc.stdout)["services"]
    assert "lensemble.yaml" in proc.stderr  # the note: the config was not written
    assert set(os.listdir("/dev")) - before == set()
    assert list(tmp_path.iterdir()) == []
