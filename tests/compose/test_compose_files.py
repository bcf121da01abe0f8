"""Rendered Compose files checked by a real Compose implementation, and the committed render.

Debian's ``docker-compose`` (1.29) validates a file without an engine: ``docker-compose -f FILE
config`` parses it against the Compose schema, resolves it and prints the normalised file, on
which the topology is asserted again.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from lensemble.config import LensembleConfig, config_hash, load_config
from lensemble.render.compose_files import write_compose
from tests.compose.conftest import REPO
from tests.compose.topology import assert_topology
from tests.support.tools import require

COMMITTED = REPO / "compose/compose.yaml"
COMMITTED_CONFIG = REPO / "compose/lensemble.yaml"


def compose_config(path: Path) -> dict[str, Any]:
    """``docker-compose -f PATH config``: the file as Compose understood it."""
    done = subprocess.run(
        ["docker-compose", "-f", str(path), "config"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, f"docker-compose rejects {path}:\n{done.stderr}"
    normalised = yaml.safe_load(done.stdout)
    assert isinstance(normalised, dict)
    return normalised


def test_docker_compose_accepts_every_environment(
    env_config: tuple[str, LensembleConfig], tmp_path: Path
) -> None:
    require("docker-compose")
    _, cfg = env_config
    files = write_compose(cfg, tmp_path / "compose.yaml")
    normalised = compose_config(files.compose)
    assert_topology(normalised, cfg)
    # Bind sources resolve next to the Compose file.
    config_mounts = {
        v["source"]
        for s in normalised["services"].values()
        for v in s["volumes"]
        if v["target"] == "/etc/lensemble/config.yaml"
    }
    assert config_mounts == {str(tmp_path / "lensemble.yaml")}


def test_docker_compose_accepts_the_committed_file() -> None:
    require("docker-compose")
    cfg = load_config(REPO / "config/local.yaml", ["federation.transport=network"])
    assert_topology(compose_config(COMMITTED), cfg)


def test_committed_container_config_has_the_source_hash() -> None:
    source = load_config(REPO / "config/local.yaml", ["federation.transport=network"])
    assert config_hash(load_config(COMMITTED_CONFIG)) == config_hash(source)
    # Freshness is tests/test_generated.py's; the header names the command that regenerates.
    assert "python -m tools.regenerate" in COMMITTED.read_text(encoding="utf-8")


def test_docker_compose_accepts_a_multi_rank_participant(tmp_path: Path) -> None:
    require("docker-compose")
    cfg = load_config(
        REPO / "config/local.yaml",
        ["federation.transport=network", "federation.participants[1].ranks.processes_per_node=2"],
    )
    normalised = compose_config(write_compose(cfg, tmp_path / "compose.yaml").compose)
    assert_topology(normalised, cfg)
    cpu = normalised["services"]["participant-coastal"]
    gpu = normalised["services"]["participant-coastal-gpu"]
    # 512 MiB of shared memory per rank (Compose v2 writes bytes, docker-compose 1.29 keeps "m").
    shm = str(cpu["shm_size"])
    assert (int(shm[:-1]) * 2**20 if shm.endswith("m") else int(shm)) == 2 * 512 * 2**20
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert int(device["count"]) == 2
    assert "shm_size" not in normalised["services"]["participant-alpine"]
