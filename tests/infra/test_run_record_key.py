"""The run record's KMS MAC key (sovereign-prod): the coordinator signs, auditors verify."""

from __future__ import annotations

import pytest
import yaml

from tests.infra.conftest import STACKS
from tests.infra.expected import as_list, statements

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pulumi_aws")

COMPONENT = "lensemble:aws:RunRecordKey"
KEY = "aws:kms/key:Key"
ROLE = "aws:iam/role:Role"


def _allowed(policy: object, action: str) -> list[str]:
    """Principals an Allow statement grants ``action`` (wildcards included)."""
    out: list[str] = []
    for statement in statements(policy):
        actions = as_list(statement["Action"])
        if statement["Effect"] == "Allow" and any(
            a == action or (a.endswith("*") and action.startswith(a[:-1])) for a in actions
        ):
            out += as_list(statement["Principal"]["AWS"])
    return out


def _denied_to_all_but(policy: object, action: str) -> str | None:
    for statement in statements(policy):
        if statement["Effect"] == "Deny" and action in as_list(statement["Action"]):
            assert as_list(statement["Principal"]["AWS"]) == ["*"]
            return str(statement["Condition"]["ArnNotEquals"]["aws:PrincipalArn"])
    return None


def test_sovereign_prod_creates_one_mac_key_with_split_rights(captured):
    capture = captured("sovereign-prod")
    [component] = capture.of_type(COMPONENT)
    [key] = capture.children(component, KEY)
    assert key.inputs["customerMasterKeySpec"] == "HMAC_256"
    assert key.inputs["keyUsage"] == "GENERATE_VERIFY_MAC"
    outputs = capture.component_outputs[component.urn]
    coordinator_arn, auditor_arn = outputs["coordinator_role_arn"], outputs["auditor_role_arn"]
    roles = {r.name: r for r in capture.children(component, ROLE)}
    coordinator = next(r for n, r in roles.items() if n.endswith("-coordinator"))
    policy = key.inputs["policy"]
    assert _allowed(policy, "kms:GenerateMac") == [coordinator_arn]
    assert _allowed(policy, "kms:VerifyMac") == [auditor_arn]
    assert _denied_to_all_but(policy, "kms:GenerateMac") == coordinator_arn
    assert _denied_to_all_but(policy, "kms:VerifyMac") == auditor_arn
    # The coordinator role is its pod's, nobody else's.
    trust = statements(coordinator.inputs["assumeRolePolicy"])[0]
    assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert capture.exports["runRecordKeyArn"] == outputs["key_arn"]
    assert capture.exports["runRecordAuditorRoleArn"] == auditor_arn


@pytest.mark.parametrize("stack", [s for s in STACKS if s != "sovereign-prod"])
def test_participants_staging_and_local_make_no_mac_key(captured, stack):
    """Participants never sign; staging and local sign with an HMAC key file if at all."""
    assert captured(stack).of_type(COMPONENT) == []


def _coordinator_env(capture) -> dict[str, str]:
    from tests.infra.test_chart_fit import rendered

    [coordinator] = [
        d
        for d in rendered(capture)
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"].get("app.kubernetes.io/component") == "coordinator"
    ]
    [container] = coordinator["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_the_sovereign_coordinator_is_given_its_run_record_key(captured):
    """The release carries the key Pulumi made, so the coordinator signs from round one."""
    capture = captured("sovereign-prod")
    [release] = capture.of_type("kubernetes:helm.sh/v3:Release")
    overrides = yaml.safe_load(release.inputs["valueYamlFiles"][1].text)
    key_arn = capture.exports["runRecordKeyArn"]
    assert overrides["coordinator"]["runRecord"] == {"kmsKeyId": key_arn}
    assert _coordinator_env(capture)["LENSEMBLE_LEDGER_KMS_KEY_ID"] == key_arn


def test_staging_coordinator_is_not_given_a_kms_key(captured):
    capture = captured("staging")
    [release] = capture.of_type("kubernetes:helm.sh/v3:Release")
    overrides = yaml.safe_load(release.inputs["valueYamlFiles"][1].text) or {}
    assert "runRecord" not in overrides.get("coordinator", {})
    assert "LENSEMBLE_LEDGER_KMS_KEY_ID" not in _coordinator_env(capture)


def test_only_a_break_glass_role_may_change_the_mac_key_policy(captured):
    """Key administrators keep everything but PutKeyPolicy; a deny backs that for everyone but
    the break-glass role, which needs MFA to assume."""
    capture = captured("sovereign-prod")
    [component] = capture.of_type(COMPONENT)
    [key] = capture.children(component, KEY)
    outputs = capture.component_outputs[component.urn]
    break_glass_arn = outputs["break_glass_role_arn"]
    policy = key.inputs["policy"]
    assert _allowed(policy, "kms:PutKeyPolicy") == [break_glass_arn]
    assert _denied_to_all_but(policy, "kms:PutKeyPolicy") == break_glass_arn
    (admin,) = [s for s in statements(policy) if s.get("Sid") == "AccountAdministersKey"]
    assert "kms:PutKeyPolicy" not in as_list(admin["Action"])
    assert "kms:DescribeKey" in as_list(admin["Action"])  # administration otherwise stays
    roles = {r.name: r for r in capture.children(component, ROLE)}
    break_glass = next(r for n, r in roles.items() if n.endswith("-break-glass"))
    [trust] = statements(break_glass.inputs["assumeRolePolicy"])
    assert trust["Condition"] == {"Bool": {"aws:MultiFactorAuthPresent": "true"}}
    # KMS would refuse a policy its creator cannot change afterwards: the check is bypassed on
    # purpose, and only for this key.
    assert key.inputs["bypassPolicyLockoutSafetyCheck"] is True
    assert capture.exports["runRecordBreakGlassRoleArn"] == break_glass_arn
