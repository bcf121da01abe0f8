"""The run record's AWS KMS MAC key: one per run, the coordinator signs, auditors verify.

``lensemble`` MACs every ledger line and checkpoint with an ``HMAC_256`` KMS key when the
coordinator's environment names it (``LENSEMBLE_LEDGER_KMS_KEY_ID``; docs/run-record.md). The
key policy splits the two uses: only the coordinator's Pod Identity role may call
``kms:GenerateMac`` (it re-computes a MAC to check its own ledger on resume, HMAC being
deterministic), and only the auditor role may call ``kms:VerifyMac``; explicit denies keep every
other principal, grants included, from either. The account keeps administering the key, except
for its policy: only a break-glass role, assumed with MFA, may change it (``kms:PutKeyPolicy``),
so no key administrator can quietly give itself the right to sign. KMS refuses to create a key
whose policy its creator could not change afterwards unless told to bypass that check, which
this key does on purpose; a later change of the policy runs with the break-glass role.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.partition import Partition
from infra.trust_domain import KEY_ADMIN_ACTIONS, pod_identity_trust_policy

__all__ = ["RunRecordKey", "RunRecordKeyArgs", "mac_key_policy"]

#: What the account's key administrators may do: everything they do on other keys but change
#: the key policy, which is the break-glass role's alone.
RECORD_KEY_ADMIN_ACTIONS = tuple(a for a in KEY_ADMIN_ACTIONS if a != "kms:PutKeyPolicy")
#: What the break-glass role may do on the key: read and replace its policy.
BREAK_GLASS_ACTIONS = ("kms:DescribeKey", "kms:GetKeyPolicy", "kms:PutKeyPolicy")


def mac_key_policy(
    account_id: str,
    coordinator_role_arn: str,
    auditor_role_arn: str,
    partition: Partition,
    break_glass_role_arn: str,
) -> str:
    """Key policy: coordinator GenerateMac only, auditors VerifyMac only, the account administers.

    Only the break-glass role may change the policy itself (``kms:PutKeyPolicy``).

    Returns:
        The policy document (JSON).
    """
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "AccountAdministersKey",
                    "Effect": "Allow",
                    "Principal": {"AWS": partition.account_root(account_id)},
                    "Action": list(RECORD_KEY_ADMIN_ACTIONS),
                    "Resource": "*",
                },
                {
                    "Sid": "BreakGlassChangesThePolicy",
                    "Effect": "Allow",
                    "Principal": {"AWS": break_glass_role_arn},
                    "Action": list(BREAK_GLASS_ACTIONS),
                    "Resource": "*",
                },
                {
                    "Sid": "NobodyElseChangesThePolicy",
                    "Effect": "Deny",
                    "Principal": {"AWS": "*"},
                    "Action": ["kms:PutKeyPolicy"],
                    "Resource": "*",
                    "Condition": {"ArnNotEquals": {"aws:PrincipalArn": break_glass_role_arn}},
                },
                {
                    "Sid": "CoordinatorSignsTheRunRecord",
                    "Effect": "Allow",
                    "Principal": {"AWS": coordinator_role_arn},
                    "Action": ["kms:GenerateMac"],
                    "Resource": "*",
                },
                {
                    "Sid": "AuditorsVerifyTheRunRecord",
                    "Effect": "Allow",
                    "Principal": {"AWS": auditor_role_arn},
                    "Action": ["kms:VerifyMac"],
                    "Resource": "*",
                },
                {
                    "Sid": "NobodyElseSigns",
                    "Effect": "Deny",
                    "Principal": {"AWS": "*"},
                    "Action": ["kms:GenerateMac"],
                    "Resource": "*",
                    "Condition": {"ArnNotEquals": {"aws:PrincipalArn": coordinator_role_arn}},
                },
                {
                    "Sid": "NobodyElseVerifies",
                    "Effect": "Deny",
                    "Principal": {"AWS": "*"},
                    "Action": ["kms:VerifyMac"],
                    "Resource": "*",
                    "Condition": {"ArnNotEquals": {"aws:PrincipalArn": auditor_role_arn}},
                },
            ],
        }
    )


@dataclass(frozen=True)
class RunRecordKeyArgs:
    """Inputs of :class:`RunRecordKey`.

    Attributes:
        run_name: ``run.name`` (named in descriptions).
        partition: The AWS partition.
        cluster_name: The coordinator's EKS cluster (Pod Identity trust).
        namespace: The coordinator's namespace.
        service_account: The coordinator's service account.
        auditor_principals: ARNs that may assume the auditor role (default: the account root).
        break_glass_principals: ARNs that may assume the break-glass role, with MFA (default:
            the account root, i.e. whoever its IAM policies allow).
        tags: Tags of every resource.
    """

    run_name: str
    partition: Partition
    cluster_name: pulumi.Input[str]
    namespace: str
    service_account: str
    auditor_principals: tuple[str, ...] = ()
    break_glass_principals: tuple[str, ...] = ()
    tags: dict[str, str] | None = None


class RunRecordKey(pulumi.ComponentResource):
    """An ``HMAC_256`` KMS key, the coordinator's signing role and the auditors' role.

    Attributes:
        key_arn: The key (``LENSEMBLE_LEDGER_KMS_KEY_ID`` of the coordinator and auditors).
        coordinator_role_arn: Role the coordinator's Pod Identity assumes.
        auditor_role_arn: Role auditors assume to run ``lensemble verify``.
        break_glass_role_arn: The only role that may change the key's policy (with MFA).
    """

    def __init__(
        self, name: str, args: RunRecordKeyArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("lensemble:aws:RunRecordKey", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        caller = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(parent=self))
        coordinator = aws.iam.Role(
            f"{name}-coordinator",
            description=f"Coordinator of run {args.run_name}: signs its run record",
            assume_role_policy=pulumi.Output.from_input(args.cluster_name).apply(
                lambda cluster: pod_identity_trust_policy(
                    args.namespace, args.service_account, cluster
                )
            ),
            tags=args.tags,
            opts=child,
        )
        auditor = _assumable_role(
            f"{name}-auditor",
            f"Auditors of run {args.run_name}: verify its run record",
            args.auditor_principals,
            args,
            account_id=caller.account_id,
            opts=child,
        )
        break_glass = _assumable_role(
            f"{name}-break-glass",
            f"Break glass of run {args.run_name}: the only role that may change the run-record "
            "key's policy",
            args.break_glass_principals,
            args,
            account_id=caller.account_id,
            opts=child,
            mfa=True,
        )
        key = aws.kms.Key(
            f"{name}-mac",
            description=f"MACs of the run record (ledger and checkpoints) of run {args.run_name}",
            key_usage="GENERATE_VERIFY_MAC",
            customer_master_key_spec="HMAC_256",
            deletion_window_in_days=30,
            policy=pulumi.Output.all(
                caller.account_id, coordinator.arn, auditor.arn, break_glass.arn
            ).apply(
                lambda parts: mac_key_policy(
                    parts[0], parts[1], parts[2], args.partition, break_glass_role_arn=parts[3]
                )
            ),
            # The creator is not the break-glass role, so it cannot change this policy after:
            # that is the point, and KMS creates such a key only when told to.
            bypass_policy_lockout_safety_check=True,
            tags=args.tags,
            opts=child,
        )
        aws.eks.PodIdentityAssociation(
            f"{name}-coordinator",
            cluster_name=args.cluster_name,
            namespace=args.namespace,
            service_account=args.service_account,
            role_arn=coordinator.arn,
            opts=child,
        )
        self.key_arn = key.arn
        self.coordinator_role_arn = coordinator.arn
        self.auditor_role_arn = auditor.arn
        self.break_glass_role_arn = break_glass.arn
        self.register_outputs(
            {
                "key_arn": self.key_arn,
                "coordinator_role_arn": self.coordinator_role_arn,
                "auditor_role_arn": self.auditor_role_arn,
                "break_glass_role_arn": self.break_glass_role_arn,
            }
        )


def _assumable_role(
    name: str,
    description: str,
    principals: tuple[str, ...],
    args: RunRecordKeyArgs,
    *,
    account_id: pulumi.Output[str],
    opts: pulumi.ResourceOptions,
    mfa: bool = False,
) -> aws.iam.Role:
    """A role ``principals`` may assume (the account root when none), with MFA when ``mfa``."""
    trusted = account_id.apply(
        lambda account: list(principals) or [args.partition.account_root(account)]
    )
    return aws.iam.Role(
        name,
        description=description,
        assume_role_policy=trusted.apply(lambda arns: _assumable_by(arns, mfa=mfa)),
        tags=args.tags,
        opts=opts,
    )


def _assumable_by(principals: list[str], *, mfa: bool = False) -> str:
    """A role trust policy: ``principals`` may assume it (with MFA when ``mfa``)."""
    statement: dict[str, object] = {
        "Effect": "Allow",
        "Principal": {"AWS": principals},
        "Action": "sts:AssumeRole",
    }
    if mfa:
        statement["Condition"] = {"Bool": {"aws:MultiFactorAuthPresent": "true"}}
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]})
