"""Each trust domain's node group is sized from the config's rank layouts (infra/sizing.py), and
the program builds exactly that node group (under the Pulumi mocks)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infra.sizing import KNOWN_INSTANCES, node_group_size
from lensemble.config import LensembleConfig, load_config
from lensemble.errors import ConfigError
from lensemble.render.ranks import rank_pod
from tests.infra.conftest import REPO

# pulumi_aws warns about its own deprecated classes whenever the engine loads them.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pulumi_aws")

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
GPU = ("deployment.image.tag=0.1.0-cu126", "federation.ranks.backend=nccl")


def staging(*overrides: str) -> LensembleConfig:
    return load_config(REPO / "config/staging.yaml", list(overrides))


def test_one_rank_per_participant_keeps_the_default_node_group() -> None:
    size = node_group_size(staging(), "site-0", stack="staging")
    assert (size.instance_type, size.nodes, size.gpu) == ("m6i.xlarge", 1, False)


def test_sovereign_prod_pods_get_a_type_that_holds_them() -> None:
    """4 CPU and 16 GiB per pod never fit an m6i.xlarge (4 vCPU, 16 GiB less what the node
    keeps): the sized group takes the next type."""
    cfg = load_config(REPO / "config/sovereign-prod.yaml")
    size = node_group_size(cfg, "org-berlin", stack="sovereign-prod")
    assert size.instance_type == "m6i.2xlarge"
    assert KNOWN_INSTANCES[size.instance_type].holds(rank_pod(cfg, "berlin"))
    assert not KNOWN_INSTANCES["m6i.xlarge"].holds(rank_pod(cfg, "berlin"))


@pytest.mark.parametrize(
    ("ranks", "instance_type", "nodes"),
    [
        # 2 CPU and 4 GiB per rank: 4 ranks on one pod need 8 CPU + node reserve.
        (("federation.ranks.processes_per_node=4",), "m6i.4xlarge", 1),
        # 2 nodes of 2 ranks: two pods, each on its own node.
        (("federation.ranks.nodes=2", "federation.ranks.processes_per_node=2"), "m6i.2xlarge", 2),
        # 3 ranks split a global batch of 96 evenly (the config requires equal shards).
        (
            ("federation.ranks.nodes=3", "federation.inner_optimizer.batch_size=96"),
            "m6i.xlarge",
            3,
        ),
    ],
)
def test_rank_layout_sets_instance_size_and_node_count(
    ranks: tuple[str, ...], instance_type: str, nodes: int
) -> None:
    cfg = staging(*ranks)
    size = node_group_size(cfg, "site-0", stack="staging")
    assert (size.instance_type, size.nodes, size.gpu) == (instance_type, nodes, False)
    pod = rank_pod(cfg, "site-0")
    assert KNOWN_INSTANCES[instance_type].holds(pod)
    smaller = [
        t
        for t in KNOWN_INSTANCES.values()
        if not t.gpus and t.vcpus < KNOWN_INSTANCES[instance_type].vcpus
    ]
    assert not any(t.holds(pod) for t in smaller)  # the smallest type that holds the pod


def test_nccl_ranks_take_a_gpu_type_with_a_gpu_per_rank() -> None:
    cfg = staging(
        *GPU, "deployment.resources.participant.gpu=4", "federation.ranks.processes_per_node=4"
    )
    size = node_group_size(cfg, "site-0", stack="staging")
    assert size.gpu is True
    chosen = KNOWN_INSTANCES[size.instance_type]
    assert chosen.gpus >= 4 and chosen.holds(rank_pod(cfg, "site-0"))
    assert size.instance_type == "g5.12xlarge"


def test_several_participants_of_one_trust_domain_share_nodes_when_they_fit() -> None:
    cfg = load_config(
        REPO / "config/local.yaml",
        [f"federation.participants[{i}].trust_domain=alpine-labs" for i in (1, 2, 3)],
    )
    # Four pods of 500m and 1 GiB: one m6i.xlarge holds them all.
    size = node_group_size(cfg, "alpine-labs", stack="local")
    assert (size.instance_type, size.nodes) == ("m6i.xlarge", 1)
    spread = load_config(
        REPO / "config/local.yaml",
        [
            *(f"federation.participants[{i}].trust_domain=alpine-labs" for i in (1, 2, 3)),
            "federation.participants[1].ranks.nodes=3",
            "federation.inner_optimizer.batch_size=96",  # three equal shards
        ],
    )
    # coastal's three pods need three nodes; the others fit beside them.
    assert node_group_size(spread, "alpine-labs", stack="local").nodes == 3


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ({"instance_type": "m6i.large"}, "lensemble:participantInstanceType"),
        ({"nodes": 1}, "lensemble:participantNodes"),
    ],
)
def test_a_stack_setting_too_small_for_the_ranks_is_refused(setting: dict, key: str) -> None:
    cfg = staging("federation.ranks.nodes=2", "federation.ranks.processes_per_node=2")
    with pytest.raises(ConfigError) as raised:
        node_group_size(cfg, "site-0", stack="staging", **setting)
    (problem,) = raised.value.problems
    assert problem.path == key
    assert problem.source == "Pulumi.staging.yaml"
    assert "remove the setting" in problem.message


def test_stack_settings_that_hold_the_pods_win() -> None:
    size = node_group_size(
        staging(), "site-0", stack="staging", instance_type="m6i.8xlarge", nodes=4
    )
    assert (size.instance_type, size.nodes) == ("m6i.8xlarge", 4)


def test_pods_larger_than_every_type_are_refused_naming_the_resources() -> None:
    cfg = staging(
        "deployment.resources.participant.memory=200Gi", "federation.ranks.processes_per_node=4"
    )
    with pytest.raises(ConfigError) as raised:
        node_group_size(cfg, "site-0", stack="staging")
    assert raised.value.problems[0].path == "deployment.resources.participant"


def test_the_program_builds_the_sized_node_groups(run_stack, tmp_path: Path) -> None:
    data = yaml.safe_load((REPO / "config/staging.yaml").read_text())
    data["federation"]["ranks"] = {"nodes": 2, "processes_per_node": 2, "backend": "nccl"}
    data["deployment"]["resources"]["participant"]["gpu"] = 2
    data["deployment"]["image"]["tag"] = "0.1.0-cu126"
    config_file = tmp_path / "ranked.yaml"
    config_file.write_text(yaml.safe_dump(data))
    capture = run_stack("staging", "aws", {"lensemble:configFile": str(config_file)})
    cfg = load_config(config_file)
    groups = {
        g.inputs["labels"]["lensemble.dev/trust-domain"]: g
        for g in capture.of_type(NODE_GROUP)
        if g.inputs["labels"].get("lensemble.dev/pool") == "participant"
    }
    assert sorted(groups) == cfg.trust_domains
    templates = {t.name: t for t in capture.of_type(LAUNCH_TEMPLATE)}
    for td, group in groups.items():
        expected = node_group_size(cfg, td, stack="staging")
        assert group.inputs["scalingConfig"]["desiredSize"] == expected.nodes == 2
        assert group.inputs["amiType"] == "AL2023_x86_64_NVIDIA"
        (template,) = [
            t
            for name, t in templates.items()
            if f"{name}-id" == group.inputs["launchTemplate"]["id"]
        ]
        assert template.inputs["instanceType"] == expected.instance_type
        assert KNOWN_INSTANCES[expected.instance_type].gpus >= 2
    system = [
        g
        for g in capture.of_type(NODE_GROUP)
        if g.inputs["labels"].get("lensemble.dev/pool") == "system"
    ]
    assert system and all(g.inputs["amiType"] == "AL2023_x86_64_STANDARD" for g in system)
