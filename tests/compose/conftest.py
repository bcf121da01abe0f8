"""Configs every Compose test renders: the three committed environments over the network."""

from __future__ import annotations

from pathlib import Path

import pytest

from lensemble.config import LensembleConfig, load_config

REPO = Path(__file__).resolve().parents[2]
#: (config file, overrides): local.yaml is the in-process simulation, so it needs the network
#: transport for Compose; staging and sovereign-prod already use it.
ENVIRONMENTS = {
    "local": ("config/local.yaml", ["federation.transport=network"]),
    "staging": ("config/staging.yaml", []),
    "sovereign-prod": ("config/sovereign-prod.yaml", []),
}


@pytest.fixture(params=sorted(ENVIRONMENTS))
def env_config(request: pytest.FixtureRequest) -> tuple[str, LensembleConfig]:
    """(environment name, config) for each committed environment."""
    path, overrides = ENVIRONMENTS[request.param]
    return request.param, load_config(REPO / path, overrides)
