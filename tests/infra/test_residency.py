"""Residency policies over every cloud stack: regions, buckets, keys, roles, trust domains."""

from __future__ import annotations

import pytest

from tests.infra.conftest import CLOUD_STACKS, PARTICIPANT_STACKS, stack_lensemble_config
from tests.infra.expected import (
    GLOBAL_MODULES,
    TRUST_DOMAIN_TYPE,
    as_list,
    namespace_of,
    region_of,
    stack_region,
    statements,
    trust_domain_of,
)

# pulumi_aws warns about its own deprecated classes whenever the engine loads them.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pulumi_aws")

BUCKET = "aws:s3/bucket:Bucket"
KEY = "aws:kms/key:Key"
ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
ASSOCIATION = "aws:eks/podIdentityAssociation:PodIdentityAssociation"


def _for_bucket(capture, type_, bucket_id):
    found = [r for r in capture.of_type(type_) if r.inputs.get("bucket") == bucket_id]
    assert len(found) == 1, f"{type_} for bucket {bucket_id}: {len(found)} found"
    return found[0].inputs


def _domain_outputs(capture):
    return {d.name: capture.component_outputs[d.urn] for d in capture.of_type(TRUST_DOMAIN_TYPE)}


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_every_regional_resource_is_in_its_pinned_region(captured, stack):
    capture = captured(stack)
    config = stack_lensemble_config(stack)
    home = stack_region(capture, config)
    checked = 0
    for resource in capture.resources:
        if not resource.type.startswith("aws:"):
            continue
        provider = capture.provider_of(resource)
        assert provider is not None, f"{resource.name} uses the default provider"
        module = resource.type.split(":")[1].split("/")[0]
        if module in GLOBAL_MODULES:
            continue
        domain = trust_domain_of(capture, resource)
        # The Pod Identity association is an EKS resource: it lives with the cluster.
        if domain is not None and resource.type != ASSOCIATION:
            expected = region_of(config, domain)
        else:
            expected = home
        assert provider.inputs["region"] == expected, f"{resource.type} {resource.name}"
        assert resource.inputs.get("region", expected) == expected, resource.name
        checked += 1
    assert checked > 20
    assert capture.calls, "the program looked up no zones or endpoint services"
    for token, region in capture.calls:
        assert region == home, f"{token} called in {region}"


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_every_bucket_is_encrypted_versioned_private_and_tls_only(captured, stack):
    capture = captured(stack)
    outputs = _domain_outputs(capture)
    buckets = capture.of_type(BUCKET)
    assert len(buckets) == len(capture.of_type(TRUST_DOMAIN_TYPE))
    keys_seen = set()
    for bucket in buckets:
        domain = trust_domain_of(capture, bucket)
        assert domain is not None, f"bucket {bucket.name} belongs to no trust domain"
        own = outputs[domain]
        name = own["bucket"]
        assert "replicationConfiguration" not in bucket.inputs

        rules = _for_bucket(
            capture,
            "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
            name,
        )["rules"]
        assert len(rules) == 1
        default = rules[0]["applyServerSideEncryptionByDefault"]
        assert default["sseAlgorithm"] == "aws:kms"
        assert default["kmsMasterKeyId"] == own["kms_key_arn"]
        keys_seen.add(default["kmsMasterKeyId"])

        versioning = _for_bucket(capture, "aws:s3/bucketVersioning:BucketVersioning", name)
        assert versioning["versioningConfiguration"]["status"] == "Enabled"

        block = _for_bucket(capture, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", name)
        for flag in (
            "blockPublicAcls",
            "blockPublicPolicy",
            "ignorePublicAcls",
            "restrictPublicBuckets",
        ):
            assert block[flag] is True, flag

        document = statements(
            _for_bucket(capture, "aws:s3/bucketPolicy:BucketPolicy", name)["policy"]
        )
        arn = own["bucket_arn"]
        tls = [
            s
            for s in document
            if s["Effect"] == "Deny"
            and s.get("Principal") == "*"
            and "s3:*" in as_list(s["Action"])
            and s.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport") == "false"
        ]
        assert tls, "no TLS-only deny statement"
        assert set(as_list(tls[0]["Resource"])) == {arn, f"{arn}/*"}
        others = [
            s
            for s in document
            if s["Effect"] == "Deny"
            and "s3:GetObject*" in as_list(s["Action"])
            and s.get("Condition", {}).get("ArnNotEquals", {}).get("aws:PrincipalArn")
            == own["role_arn"]
        ]
        assert others, "data access is not denied to every principal but the participant's role"
        replication = [
            s
            for s in document
            if s["Effect"] == "Deny" and "s3:PutReplicationConfiguration" in as_list(s["Action"])
        ]
        assert replication, "replication is not denied"
    assert len(keys_seen) == len(buckets), "two buckets share a KMS key"
    assert not any(r.type.startswith("aws:s3/bucketReplicationConfig") for r in capture.resources)


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_each_key_is_single_region_and_used_only_by_its_participant(captured, stack):
    capture = captured(stack)
    outputs = _domain_outputs(capture)
    for domain in capture.of_type(TRUST_DOMAIN_TYPE):
        keys = capture.children(domain, KEY)
        assert len(keys) == 1
        key = keys[0].inputs
        assert key["multiRegion"] is False
        assert key["enableKeyRotation"] is True
        role_arn = outputs[domain.name]["role_arn"]
        for statement in statements(key["policy"]):
            principals = as_list(statement["Principal"]["AWS"])
            uses = {
                a
                for a in as_list(statement["Action"])
                if a in ("kms:Decrypt", "kms:Encrypt") or a.startswith("kms:GenerateDataKey")
            }
            if uses:
                assert principals == [role_arn], "someone but the participant can use the key"
                assert "kms:ViaService" in statement["Condition"]["StringEquals"]


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_each_role_reaches_only_its_own_bucket_and_key(captured, stack):
    capture = captured(stack)
    outputs = _domain_outputs(capture)
    for domain in capture.of_type(TRUST_DOMAIN_TYPE):
        own = outputs[domain.name]
        allowed = {own["bucket_arn"], f"{own['bucket_arn']}/*", own["kms_key_arn"]}
        policies = capture.children(domain, ROLE_POLICY)
        assert len(policies) == 1
        granted = set()
        for statement in statements(policies[0].inputs["policy"]):
            assert statement["Effect"] == "Allow"
            actions = as_list(statement["Action"])
            assert not any(a in ("*", "s3:*", "kms:*") for a in actions), actions
            resources = set(as_list(statement["Resource"]))
            assert resources <= allowed, f"{domain.name} reaches {resources - allowed}"
            granted |= resources
        assert granted == allowed


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_each_role_is_bound_to_its_own_namespace_and_service_account(captured, stack):
    capture = captured(stack)
    config = stack_lensemble_config(stack)
    outputs = _domain_outputs(capture)
    cluster_name = capture.exports["clusterName"]
    bindings = set()
    for domain in capture.of_type(TRUST_DOMAIN_TYPE):
        namespace = namespace_of(config, domain.name)
        [association] = capture.children(domain, ASSOCIATION)
        binding = association.inputs
        assert binding["namespace"] == namespace
        assert binding["roleArn"] == outputs[domain.name]["role_arn"]
        assert binding["clusterName"] == cluster_name
        bindings.add((binding["namespace"], binding["serviceAccount"]))

        [role] = capture.children(domain, ROLE)
        [trust] = statements(role.inputs["assumeRolePolicy"])
        assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"}
        tags = trust["Condition"]["StringEquals"]
        assert tags["aws:RequestTag/kubernetes-namespace"] == namespace
        assert tags["aws:RequestTag/kubernetes-service-account"] == binding["serviceAccount"]
        assert tags["aws:RequestTag/eks-cluster-name"] == cluster_name
    assert len(bindings) == len(capture.of_type(TRUST_DOMAIN_TYPE)), (
        "two trust domains share an identity"
    )


def test_trust_domains_equal_the_config(captured):
    staging = stack_lensemble_config("staging")
    names = sorted(d.name for d in captured("staging").of_type(TRUST_DOMAIN_TYPE))
    assert names == staging.trust_domains

    sovereign = stack_lensemble_config("sovereign-prod")
    assert captured("sovereign-prod").of_type(TRUST_DOMAIN_TYPE) == []
    per_stack = [captured(s).of_type(TRUST_DOMAIN_TYPE) for s in PARTICIPANT_STACKS]
    assert all(len(found) == 1 for found in per_stack)
    assert sorted(found[0].name for found in per_stack) == sovereign.trust_domains


@pytest.mark.parametrize("stack", PARTICIPANT_STACKS)
def test_participant_stack_outputs_its_own_bucket_and_key(captured, stack):
    capture = captured(stack)
    config = stack_lensemble_config(stack)
    [domain] = capture.of_type(TRUST_DOMAIN_TYPE)
    own = capture.component_outputs[domain.urn]
    members = [p for p in config.federation.participants if p.trust_domain == domain.name]
    assert set(capture.exports["participants"]) == {p.id for p in members}
    for p in members:
        exported = capture.exports["participants"][p.id]
        assert exported["bucket"] == own["bucket"]
        assert exported["kmsKeyArn"] == own["kms_key_arn"]
        assert exported["region"] == p.region
