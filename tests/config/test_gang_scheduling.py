"""Deployment rules that multi-rank participants add: gang admission and the rendezvous port."""

from __future__ import annotations

from pathlib import Path

import pytest

from lensemble.config import load_config
from lensemble.errors import ConfigError


def test_gang_admission_is_off_by_default(in_repo: Path) -> None:
    for env in ("local", "staging", "sovereign-prod"):
        gang = load_config(f"config/{env}.yaml").deployment.gang_scheduling
        assert (gang.scheduler, gang.queue) == ("none", "")


def test_kueue_without_a_queue_names_the_field(in_repo: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config("config/staging.yaml", ["deployment.gang_scheduling.scheduler=kueue"])
    (problem,) = raised.value.problems
    assert problem.path == "deployment.gang_scheduling.queue"
    assert "set deployment.gang_scheduling.queue" in problem.message


def test_volcano_takes_its_default_queue(in_repo: Path) -> None:
    cfg = load_config("config/staging.yaml", ["deployment.gang_scheduling.scheduler=volcano"])
    assert cfg.deployment.gang_scheduling.queue == ""


def test_a_queue_that_is_no_kubernetes_name_is_refused(in_repo: Path) -> None:
    with pytest.raises(ConfigError, match=r"deployment\.gang_scheduling\.queue"):
        load_config("config/staging.yaml", ["deployment.gang_scheduling.queue=Team_A"])


@pytest.mark.parametrize("port_field", ["health_port", "metrics_port"])
def test_a_rendezvous_port_on_a_served_port_is_refused(in_repo: Path, port_field: str) -> None:
    # Only a multi-node group listens on rendezvous_port (one node takes a free port).
    cfg = load_config("config/staging.yaml")
    port = getattr(cfg.network, port_field)
    with pytest.raises(ConfigError) as raised:
        load_config(
            "config/staging.yaml",
            ["federation.ranks.nodes=2", f"federation.ranks.rendezvous_port={port}"],
        )
    (problem,) = raised.value.problems
    assert problem.path == "federation.ranks.rendezvous_port"
    assert f"network.{port_field}" in problem.message


@pytest.mark.parametrize("ranks", ["processes_per_node=1", "processes_per_node=2"])
def test_one_node_never_listens_on_the_rendezvous_port(in_repo: Path, ranks: str) -> None:
    # One rank has no rendezvous; one node of several ranks meets on a free loopback port
    # (issue 41, item 1), so neither ever listens on rendezvous_port.
    cfg = load_config("config/staging.yaml")
    same = load_config(
        "config/staging.yaml",
        [
            f"federation.ranks.{ranks}",
            f"federation.ranks.rendezvous_port={cfg.network.health_port}",
        ],
    )
    assert same.federation.ranks.rendezvous_port == cfg.network.health_port
