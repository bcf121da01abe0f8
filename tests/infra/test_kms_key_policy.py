"""Each participant's KMS key: administrators manage it but can never hand out its use, and its
bucket takes only objects encrypted under it (issue 12, item 6), under the Pulumi mock engine.

On main the key policy's admin statement granted ``kms:Create*`` and ``kms:Put*`` (so
``CreateGrant``, which lets an administrator give anyone the key's use) and the bucket accepted
objects under any encryption.
"""

from __future__ import annotations

import fnmatch

import pytest

from tests.infra.conftest import CLOUD_STACKS
from tests.infra.expected import TRUST_DOMAIN_TYPE, as_list, statements

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pulumi_aws")

#: Stacks that hold trust domains (the sovereign-prod parent holds only the coordinator side).
DOMAIN_STACKS = [s for s in CLOUD_STACKS if s != "sovereign-prod"]

KEY = "aws:kms/key:Key"
BUCKET_POLICY = "aws:s3/bucketPolicy:BucketPolicy"
#: Actions that hand the key's use, or its policy, to someone else.
GRANTING = ("kms:CreateGrant", "kms:Encrypt", "kms:Decrypt", "kms:GenerateDataKey")


def _allows(statement: dict, action: str) -> bool:
    return statement["Effect"] == "Allow" and any(
        fnmatch.fnmatchcase(action, pattern) for pattern in as_list(statement["Action"])
    )


@pytest.mark.parametrize("stack", DOMAIN_STACKS)
def test_key_administrators_get_an_explicit_list_without_grants(captured, stack):
    capture = captured(stack)
    domains = capture.of_type(TRUST_DOMAIN_TYPE)
    assert domains
    for domain in domains:
        (key,) = capture.children(domain, KEY)
        document = statements(key.inputs["policy"])
        (admin,) = [s for s in document if s.get("Sid") == "AccountAdministersKey"]
        actions = as_list(admin["Action"])
        assert not [a for a in actions if "*" in a], f"wildcards in {actions}"
        assert "kms:PutKeyPolicy" in actions  # the stack must still update the policy
        for action in GRANTING:
            assert not _allows(admin, action), f"administrators may {action}"
        (deny,) = [s for s in document if s["Effect"] == "Deny"]
        assert as_list(deny["Action"]) == ["kms:CreateGrant"]
        assert deny["Principal"] == {"AWS": "*"}
        for statement in document:
            assert not _allows(statement, "kms:CreateGrant")


@pytest.mark.parametrize("stack", DOMAIN_STACKS)
def test_the_bucket_refuses_objects_not_under_the_participants_key(captured, stack):
    capture = captured(stack)
    for domain in capture.of_type(TRUST_DOMAIN_TYPE):
        key_arn = capture.component_outputs[domain.urn]["kms_key_arn"]
        bucket_arn = capture.component_outputs[domain.urn]["bucket_arn"]
        (policy,) = capture.children(domain, BUCKET_POLICY)
        document = statements(policy.inputs["policy"])
        puts = [
            s
            for s in document
            if s["Effect"] == "Deny"
            and "s3:PutObject" in as_list(s["Action"])
            and s["Principal"] == "*"
        ]
        conditions = {
            key: value
            for s in puts
            for values in s["Condition"].values()
            for key, value in values.items()
        }
        assert conditions == {
            "s3:x-amz-server-side-encryption": "aws:kms",
            "s3:x-amz-server-side-encryption-aws-kms-key-id": key_arn,
        }
        for statement in puts:
            assert list(statement["Condition"]) == ["StringNotEquals"]  # absent header: denied
            assert as_list(statement["Resource"]) == [f"{bucket_arn}/*"]
