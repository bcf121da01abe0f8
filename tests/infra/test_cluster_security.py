"""Network and cluster policies: no open ingress, private API in sovereign-prod, SEV-SNP,
audit logs, VPC endpoints, node groups per trust domain."""

from __future__ import annotations

import pytest
import yaml

from tests.infra.conftest import (
    CLOUD_STACKS,
    PARTICIPANT_STACKS,
    REPO,
    SOVEREIGN_STACKS,
    stack_lensemble_config,
)

CHART_VALUES = REPO / "charts" / "lensemble" / "values.yaml"

# pulumi_aws warns about its own deprecated classes whenever the engine loads them.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pulumi_aws")

ANYWHERE = ("0.0.0.0/0", "::/0")
SNP_FAMILIES = ("m6a", "c6a", "r6a")
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
EKS = "aws:eks/cluster:Cluster"


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_no_security_group_rule_is_open_to_the_internet(captured, stack):
    capture = captured(stack)
    rules = capture.of_type(INGRESS)
    assert rules, "no ingress rule was registered"
    for rule in rules:
        assert rule.inputs.get("cidrIpv4") not in ANYWHERE, rule.name
        assert rule.inputs.get("cidrIpv6") not in ANYWHERE, rule.name
    assert capture.of_type("aws:ec2/securityGroupRule:SecurityGroupRule") == []
    for group in capture.of_type("aws:ec2/securityGroup:SecurityGroup"):
        assert not group.inputs.get("ingress"), "inline ingress escapes the rule check"


def test_coordinator_load_balancer_admits_only_the_listed_participants(run_stack):
    """Documented: the coordinator's gRPC port faces the internet only through its load
    balancer, for the addresses in lensemble:coordinatorIngressCidrs."""
    capture = run_stack(
        "sovereign-prod",
        "aws",
        {"lensemble:coordinatorIngressCidrs": ["198.51.100.0/24", "203.0.113.10/32"]},
    )
    [release] = capture.of_type("kubernetes:helm.sh/v3:Release")
    overrides = yaml.safe_load(release.inputs["valueYamlFiles"][1].text)
    service = overrides["coordinator"]["service"]
    assert service["type"] == "LoadBalancer"
    ranges = service["annotations"]["service.beta.kubernetes.io/load-balancer-source-ranges"]
    assert ranges.split(",") == ["198.51.100.0/24", "203.0.113.10/32"]
    peers = [p["ipBlock"]["cidr"] for p in overrides["networkPolicy"]["participantPeers"]]
    assert peers == ["198.51.100.0/24", "203.0.113.10/32"]
    # Public subnets for the load balancer, still no route out for the nodes.
    assert capture.of_type("aws:ec2/internetGateway:InternetGateway")
    assert capture.of_type("aws:ec2/natGateway:NatGateway") == []


def test_without_listed_participants_the_coordinator_stays_inside_its_cluster(captured):
    [release] = captured("sovereign-prod").of_type("kubernetes:helm.sh/v3:Release")
    overrides = yaml.safe_load(release.inputs["valueYamlFiles"][1].text)
    # The coordinator override holds only its run-record key: no Service change.
    assert "service" not in overrides.get("coordinator", {}) and "networkPolicy" not in overrides


@pytest.mark.parametrize("stack", SOVEREIGN_STACKS)
def test_sovereign_api_server_is_private(captured, stack):
    [cluster] = captured(stack).of_type(EKS)
    vpc = cluster.inputs["vpcConfig"]
    assert vpc["endpointPublicAccess"] is False
    assert vpc["endpointPrivateAccess"] is True


def test_staging_api_server_is_public_only_to_listed_networks(run_stack, captured):
    [private] = captured("staging").of_type(EKS)
    assert private.inputs["vpcConfig"]["endpointPublicAccess"] is False
    config = stack_lensemble_config("staging")
    capture = run_stack(
        "staging",
        config.deployment.cloud.partition,
        {"lensemble:apiAllowedCidrs": ["198.51.100.7/32"]},
    )
    [public] = capture.of_type(EKS)
    assert public.inputs["vpcConfig"]["endpointPublicAccess"] is True
    assert public.inputs["vpcConfig"]["publicAccessCidrs"] == ["198.51.100.7/32"]


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_control_plane_logs_audit_and_runs_pod_identity(captured, stack):
    capture = captured(stack)
    [cluster] = capture.of_type(EKS)
    assert "audit" in cluster.inputs["enabledClusterLogTypes"]
    assert cluster.inputs["encryptionConfig"]["resources"] == ["secrets"]
    addons = {a.inputs["addonName"] for a in capture.of_type("aws:eks/addon:Addon")}
    assert "eks-pod-identity-agent" in addons


def _template_of(capture, group):
    template_id = group.inputs["launchTemplate"]["id"]
    return next(t for t in capture.of_type(LAUNCH_TEMPLATE) if f"{t.name}-id" == template_id)


def _tolerated(taint, tolerations):
    effects = {
        "NO_SCHEDULE": "NoSchedule",
        "NO_EXECUTE": "NoExecute",
        "PREFER_NO_SCHEDULE": "PreferNoSchedule",
    }
    return any(
        t["key"] == taint["key"]
        and (t["operator"] == "Exists" or t.get("value") == taint.get("value"))
        and t.get("effect") in (None, effects[taint["effect"]])
        for t in tolerations
    )


def test_confidential_coordinator_pool_enables_sev_snp_where_the_chart_places_it(captured):
    config = stack_lensemble_config("sovereign-prod")
    assert config.deployment.confidential_compute
    chart = yaml.safe_load(CHART_VALUES.read_text())["coordinator"]
    capture = captured("sovereign-prod")
    confidential = [
        g
        for g in capture.of_type(NODE_GROUP)
        if chart["confidentialNodeSelector"].items() <= g.inputs["labels"].items()
    ]
    assert len(confidential) == 1
    template = _template_of(capture, confidential[0]).inputs
    assert template["cpuOptions"]["amdSevSnp"] == "enabled"
    assert template["instanceType"].split(".")[0] in SNP_FAMILIES
    taints = confidential[0].inputs["taints"]
    assert taints, "other pods could land on the confidential nodes"
    assert all(_tolerated(t, chart["confidentialTolerations"]) for t in taints)


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_only_the_confidential_pool_asks_for_sev_snp_and_every_node_hides_imds(captured, stack):
    capture = captured(stack)
    for group in capture.of_type(NODE_GROUP):
        template = _template_of(capture, group).inputs
        snp = template.get("cpuOptions", {}).get("amdSevSnp") == "enabled"
        assert snp == (group.inputs["labels"].get("lensemble.dev/pool") == "coordinator")
        assert template["metadataOptions"]["httpTokens"] == "required"
        assert template["metadataOptions"]["httpPutResponseHopLimit"] == 1
        assert template["blockDeviceMappings"][0]["ebs"]["encrypted"] == "true"


def test_non_snp_coordinator_instance_type_is_refused(run_stack):
    from lensemble.errors import ConfigError

    with pytest.raises(ConfigError, match="coordinatorInstanceType"):
        run_stack("sovereign-prod", "aws", {"lensemble:coordinatorInstanceType": "m6i.xlarge"})


def test_region_without_sev_snp_fails_before_creating_the_pool(run_stack):
    with pytest.raises(Exception, match="not offered with AMD SEV-SNP in eu-west-1"):
        run_stack("sovereign-prod", "aws", sev_snp_offered=False)


@pytest.mark.parametrize("stack", ["staging", *PARTICIPANT_STACKS])
def test_participant_pools_are_labelled_and_tainted_as_the_config_says(captured, stack):
    capture = captured(stack)
    config = stack_lensemble_config(stack)
    pools = {
        g.inputs["labels"]["lensemble.dev/trust-domain"]: g.inputs
        for g in capture.of_type(NODE_GROUP)
        if "lensemble.dev/trust-domain" in g.inputs["labels"]
    }
    domains = {d.name for d in capture.of_type("lensemble:aws:ParticipantTrustDomain")}
    assert set(pools) == domains
    for domain, pool in pools.items():
        placement = config.deployment.trust_domains.get(domain)
        selector = placement.node_selector if placement else {}
        assert selector.items() <= pool["labels"].items()
        expected = {
            (t.key, t.value, (t.effect or "NoSchedule"))
            for t in (placement.tolerations if placement else [])
        }
        effects = {
            "NO_SCHEDULE": "NoSchedule",
            "NO_EXECUTE": "NoExecute",
            "PREFER_NO_SCHEDULE": "PreferNoSchedule",
        }
        found = {(t["key"], t.get("value"), effects[t["effect"]]) for t in pool.get("taints", [])}
        assert found == expected


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_nodes_reach_aws_through_vpc_endpoints(captured, stack):
    capture = captured(stack)
    # com.amazonaws.<region>.<service>
    services = {
        e.inputs["serviceName"].split(".", 3)[-1]
        for e in capture.of_type("aws:ec2/vpcEndpoint:VpcEndpoint")
    }
    assert {"s3", "ecr.api", "ecr.dkr", "sts", "logs"} <= services


def test_sovereign_coordinator_has_no_internet_egress(captured):
    capture = captured("sovereign-prod")
    assert capture.of_type("aws:ec2/natGateway:NatGateway") == []
    assert capture.of_type("aws:ec2/internetGateway:InternetGateway") == []
    assert not any(
        r.inputs.get("destinationCidrBlock") == "0.0.0.0/0"
        for r in capture.of_type("aws:ec2/route:Route")
    )
