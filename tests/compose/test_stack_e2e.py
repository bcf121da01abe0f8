"""``lensemble up``/``down`` end to end on a real Docker engine (skipped where none runs).

Builds the CPU image when it is missing (several minutes), then runs a two-round federation
from ``config/local.yaml`` as a Compose stack. ``scripts/docker-checks.sh`` runs the same.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from lensemble import __version__
from tests.compose.conftest import REPO
from tests.support.tools import require

pytestmark = [pytest.mark.docker, pytest.mark.slow]
IMAGE = f"lensemble:{__version__}-cpu"


def lensemble(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["lensemble", *args], cwd=REPO, capture_output=True, text=True, check=False, timeout=3600
    )


def test_up_runs_two_rounds_and_down_tears_down_once(tmp_path: Path) -> None:
    require("docker")
    have_image = subprocess.run(
        ["docker", "image", "inspect", IMAGE], capture_output=True, check=False
    )
    if have_image.returncode != 0:
        subprocess.run(["docker", "build", "-t", IMAGE, "."], cwd=REPO, check=True, timeout=3600)
    stack = tmp_path / "stack"
    try:
        up = lensemble(
            "up",
            "--substrate",
            "compose",
            "--config",
            "config/local.yaml",
            "--set",
            "federation.transport=network",
            "--set",
            "federation.rounds=2",
            "--set",
            "federation.inner_steps=2",
            "--dir",
            str(stack),
        )
        assert up.returncode == 0, up.stdout + up.stderr
        ready = [line for line in up.stdout.splitlines() if line.startswith("ready: ")]
        assert len(ready) == 5, up.stdout
        assert "run finished" in up.stdout
    finally:
        down = lensemble("down", "--dir", str(stack), "--volumes")
    assert down.returncode == 0, down.stderr
    assert "torn down" in down.stdout
    again = lensemble("down", "--dir", str(stack))
    assert again.returncode == 0
    assert "nothing to tear down" in again.stdout
