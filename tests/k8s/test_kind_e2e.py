"""End to end on a real kind cluster: ``python -m tools.kind up`` then ``... down``.

Needs Docker, kind and kubectl; CI machines have no Docker engine, so this is skipped there (the
rest of tests/k8s validates the same manifests statically).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.tools import require

pytestmark = pytest.mark.kind


def test_kind_up_runs_rounds_and_reports_the_hash_chain(repo: Path) -> None:
    require("kind")
    require("kubectl")
    try:
        up = subprocess.run(
            [
                sys.executable,
                "-m",
                "tools.kind",
                "up",
                "--config",
                "config/local.yaml",
                "--rounds",
                "2",
            ],
            cwd=repo,
            capture_output=True,
            text=True,
            check=False,
            timeout=3600,
        )
        assert up.returncode == 0, up.stderr[-4000:]
        rounds = [json.loads(line) for line in up.stdout.splitlines() if line.startswith("{")]
        assert [r["round"] for r in rounds][:2] == [rounds[0]["round"], rounds[0]["round"] + 1]
        assert all(b["parent_hash"] == a["model_hash"] for a, b in itertools.pairwise(rounds))
    finally:
        down = subprocess.run(
            [sys.executable, "-m", "tools.kind", "down", "--config", "config/local.yaml"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=False,
        )
    assert down.returncode == 0, down.stderr
