"""Each stack's program runs once per session under recording mocks; tests share the capture."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from lensemble.config import LensembleConfig, load_config
from tests.infra.expected import stack_config
from tests.support.tools import require

if TYPE_CHECKING:
    from tests.infra.recording import Capture

REPO = Path(__file__).resolve().parents[2]
#: Every stack file of the project.
STACKS = sorted(
    p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in REPO.glob("Pulumi.*.yaml")
)
CLOUD_STACKS = [s for s in STACKS if s != "local"]
SOVEREIGN_STACKS = [s for s in STACKS if s.startswith("sovereign-prod")]
PARTICIPANT_STACKS = [s for s in SOVEREIGN_STACKS if s != "sovereign-prod"]


def stack_lensemble_config(stack: str) -> LensembleConfig:
    """The LensembleConfig a stack file names."""
    return load_config(REPO / stack_config(stack)["lensemble:configFile"])


@pytest.fixture(scope="session")
def captured() -> Callable[[str], Capture]:
    """``captured(stack)``: what the real program registered for that stack file (cached)."""
    require("pulumi")
    from tests.infra.recording import run_stack

    cache: dict[str, Capture] = {}

    def get(stack: str) -> Capture:
        if stack not in cache:
            config = stack_lensemble_config(stack)
            cache[stack] = run_stack(stack, config.deployment.cloud.partition)
        return cache[stack]

    return get


@pytest.fixture
def run_stack() -> Callable[..., Capture]:
    """``run_stack(stack, partition, extra_config, *, sev_snp_offered)``: a fresh run, uncached."""
    require("pulumi")
    from tests.infra.recording import run_stack as run

    return run
