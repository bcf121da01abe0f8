"""``ParticipantTrustDomain``: one organisation's data boundary in the cloud.

Everything a participant's data touches lives here, in the participant's pinned region: a
namespace, a bucket encrypted under the participant's own KMS key, and an IAM role that only
that participant's service account can assume (EKS Pod Identity) and that reaches only that
bucket and key. The key and the bucket policy repeat the same boundary from the resource side,
so a mistake in one policy does not open the data (the residency invariant:
docs/concepts.md#residency).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.partition import Partition
from infra.tls import TlsIdentity, tls_secret
from lensemble.render.names import TRUST_DOMAIN_LABEL

#: Object-level S3 actions only the participant's role may perform on its bucket.
DATA_ACTIONS = (
    "s3:GetObject*",
    "s3:PutObject*",
    "s3:DeleteObject*",
    "s3:ListBucket*",
    "s3:RestoreObject",
    "s3:AbortMultipartUpload",
    "s3:ListMultipartUploadParts",
)
#: KMS actions the participant's role needs to read and write its bucket.
KEY_USE_ACTIONS = (
    "kms:Encrypt",
    "kms:Decrypt",
    "kms:ReEncrypt*",
    "kms:GenerateDataKey*",
    "kms:DescribeKey",
)
#: KMS actions of the account's administrators: manage the key, never use it. Listed one by one
#: (no ``kms:Create*`` or ``kms:Put*``): a wildcard would also grant ``kms:CreateGrant``, with
#: which an administrator could let any principal use the key. ``kms:PutKeyPolicy`` stays: the
#: stack updates the key policy with it, and KMS refuses a policy that locks its caller out.
KEY_ADMIN_ACTIONS = (
    "kms:CreateAlias",
    "kms:UpdateAlias",
    "kms:DeleteAlias",
    "kms:DescribeKey",
    "kms:GetKeyPolicy",
    "kms:GetKeyRotationStatus",
    "kms:ListAliases",
    "kms:ListGrants",
    "kms:ListKeyPolicies",
    "kms:ListKeyRotations",
    "kms:ListResourceTags",
    "kms:PutKeyPolicy",
    "kms:UpdateKeyDescription",
    "kms:EnableKey",
    "kms:DisableKey",
    "kms:EnableKeyRotation",
    "kms:DisableKeyRotation",
    "kms:RevokeGrant",
    "kms:TagResource",
    "kms:UntagResource",
    "kms:ScheduleKeyDeletion",
    "kms:CancelKeyDeletion",
)
#: KMS actions nobody may perform on a participant's key: grants hand key use to others.
KEY_DENIED_ACTIONS = ("kms:CreateGrant",)


@dataclass(frozen=True)
class ParticipantTrustDomainArgs:
    """Inputs of a :class:`ParticipantTrustDomain`.

    Attributes:
        trust_domain: Trust domain name (a DNS-1123 label from the config).
        participant_ids: Participants of this trust domain (config order).
        region: The participant's pinned region; bucket, key and role live there.
        partition: ARN partition.
        cluster_name: EKS cluster whose Pod Identity association binds the role.
        cluster_provider: AWS provider of the cluster's region (for the association).
        kubernetes: Kubernetes provider of the cluster.
        namespace: Namespace of the trust domain's pods.
        namespace_labels: Labels of the namespace when it is created here.
        create_namespace: Create the namespace here (False when several trust domains share
            one namespace, which the program then creates once, or when an overlay makes it).
        service_account: Service account of the trust domain's pods.
        account_id: AWS account the regional provider refuses to leave, when known.
        tags: Default tags of the regional provider.
        tls: TLS Secrets to make in the namespace, one per participant.
    """

    trust_domain: str
    participant_ids: tuple[str, ...]
    region: str
    partition: Partition
    cluster_name: pulumi.Input[str]
    cluster_provider: aws.Provider
    kubernetes: k8s.Provider
    namespace: str
    create_namespace: bool
    service_account: str
    namespace_labels: dict[str, str] = field(default_factory=dict)
    account_id: str | None = None
    tags: dict[str, str] | None = None
    tls: tuple[TlsIdentity, ...] = ()


def pod_identity_trust_policy(namespace: str, service_account: str, cluster_name: str) -> str:
    """Trust policy letting only one service account of one cluster assume a role.

    EKS Pod Identity tags every session with the cluster, namespace and service account; the
    conditions check those tags (EKS User Guide, "pod-id-abac").

    Returns:
        The policy document (JSON).
    """
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "PodIdentityOfThisParticipantOnly",
                    "Effect": "Allow",
                    "Principal": {"Service": "pods.eks.amazonaws.com"},
                    "Action": ["sts:AssumeRole", "sts:TagSession"],
                    "Condition": {
                        "StringEquals": {
                            "aws:RequestTag/eks-cluster-name": cluster_name,
                            "aws:RequestTag/kubernetes-namespace": namespace,
                            "aws:RequestTag/kubernetes-service-account": service_account,
                        }
                    },
                }
            ],
        }
    )


def participant_access_policy(bucket_arn: str, key_arn: str, partition: Partition) -> str:
    """Identity policy of a participant's role: its own bucket and key, nothing else.

    Returns:
        The policy document (JSON).
    """
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "ListOwnBucket",
                    "Effect": "Allow",
                    "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
                    "Resource": [bucket_arn],
                },
                {
                    "Sid": "ReadWriteOwnObjects",
                    "Effect": "Allow",
                    "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                    "Resource": [partition.bucket_objects(bucket_arn)],
                },
                {
                    "Sid": "UseOwnKey",
                    "Effect": "Allow",
                    "Action": list(KEY_USE_ACTIONS),
                    "Resource": [key_arn],
                },
            ],
        }
    )


def key_policy(account_id: str, role_arn: str, region: str, partition: Partition) -> str:
    """Key policy: the account administers the key; only the participant's role uses it, via S3.

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
                    "Action": list(KEY_ADMIN_ACTIONS),
                    "Resource": "*",
                },
                {
                    "Sid": "NobodyGrantsKeyUse",
                    "Effect": "Deny",
                    "Principal": {"AWS": "*"},
                    "Action": list(KEY_DENIED_ACTIONS),
                    "Resource": "*",
                },
                {
                    "Sid": "ParticipantUsesKeyThroughS3",
                    "Effect": "Allow",
                    "Principal": {"AWS": role_arn},
                    "Action": list(KEY_USE_ACTIONS),
                    "Resource": "*",
                    "Condition": {
                        "StringEquals": {"kms:ViaService": partition.service_endpoint("s3", region)}
                    },
                },
            ],
        }
    )


def bucket_policy(bucket_arn: str, role_arn: str, key_arn: str, partition: Partition) -> str:
    """Bucket policy: TLS only, participant-only data access, objects under its own key only.

    No replication either. Management actions (policy, tags, lifecycle) stay with the account's
    administrators so the stack can still update the bucket; reading or writing data is denied
    to everyone else. A ``PutObject`` must name SSE-KMS and the key's ARN (``--sse aws:kms
    --sse-kms-key-id ARN``): an upload under another key, or one relying on a default
    encryption someone might change, is refused.

    Returns:
        The policy document (JSON).
    """
    objects = partition.bucket_objects(bucket_arn)
    resources = [bucket_arn, objects]
    statements: list[dict[str, Any]] = [
        {
            "Sid": "DenyInsecureTransport",
            "Effect": "Deny",
            "Principal": "*",
            "Action": "s3:*",
            "Resource": resources,
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        },
        {
            "Sid": "DenyDataAccessButParticipant",
            "Effect": "Deny",
            "Principal": "*",
            "Action": list(DATA_ACTIONS),
            "Resource": resources,
            "Condition": {"ArnNotEquals": {"aws:PrincipalArn": role_arn}},
        },
        {
            "Sid": "DenyObjectsWithoutSseKms",
            "Effect": "Deny",
            "Principal": "*",
            "Action": "s3:PutObject",
            "Resource": [objects],
            "Condition": {"StringNotEquals": {"s3:x-amz-server-side-encryption": "aws:kms"}},
        },
        {
            "Sid": "DenyObjectsUnderAnotherKey",
            "Effect": "Deny",
            "Principal": "*",
            "Action": "s3:PutObject",
            "Resource": [objects],
            "Condition": {
                "StringNotEquals": {"s3:x-amz-server-side-encryption-aws-kms-key-id": key_arn}
            },
        },
        {
            "Sid": "DenyReplication",
            "Effect": "Deny",
            "Principal": "*",
            "Action": ["s3:PutReplicationConfiguration", "s3:ReplicateObject"],
            "Resource": resources,
        },
    ]
    return json.dumps({"Version": "2012-10-17", "Statement": statements})


class ParticipantTrustDomain(pulumi.ComponentResource):
    """Namespace, bucket, KMS key and IAM role of one trust domain, in its pinned region.

    Outputs: ``bucket``, ``bucket_arn``, ``kms_key_arn``, ``role_arn``, ``namespace``,
    ``region``.
    """

    def __init__(
        self,
        name: str,
        args: ParticipantTrustDomainArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("lensemble:aws:ParticipantTrustDomain", name, None, opts)
        self._resource_name = name
        self._args = args
        regional = aws.Provider(
            f"{name}-region",
            region=args.region,
            allowed_account_ids=[args.account_id] if args.account_id else None,
            default_tags=aws.ProviderDefaultTagsArgs(
                tags={**(args.tags or {}), TRUST_DOMAIN_LABEL: args.trust_domain}
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self._child = pulumi.ResourceOptions(parent=self, provider=regional)
        caller = aws.get_caller_identity_output(
            opts=pulumi.InvokeOutputOptions(parent=self, provider=regional)
        )
        self._in_cluster()
        role = aws.iam.Role(
            f"{name}-participant",
            description=(
                f"Pod Identity of trust domain {args.trust_domain} "
                f"(participants {', '.join(args.participant_ids)})"
            ),
            assume_role_policy=pulumi.Output.from_input(args.cluster_name).apply(
                lambda cluster: pod_identity_trust_policy(
                    args.namespace, args.service_account, cluster
                )
            ),
            opts=self._child,
        )
        key = aws.kms.Key(
            f"{name}-data",
            description=f"Data of trust domain {args.trust_domain}",
            enable_key_rotation=True,
            multi_region=False,
            deletion_window_in_days=30,
            policy=pulumi.Output.all(caller.account_id, role.arn).apply(
                lambda parts: key_policy(parts[0], parts[1], args.region, args.partition)
            ),
            opts=self._child,
        )
        bucket = self._bucket(role, key)
        self._pod_identity(role, bucket, key)
        self.bucket = bucket.bucket
        self.bucket_arn = bucket.arn
        self.kms_key_arn = key.arn
        self.role_arn = role.arn
        self.namespace = args.namespace
        self.region = args.region
        self.register_outputs(
            {
                "bucket": self.bucket,
                "bucket_arn": self.bucket_arn,
                "kms_key_arn": self.kms_key_arn,
                "role_arn": self.role_arn,
                "namespace": self.namespace,
                "region": self.region,
            }
        )

    def _in_cluster(self) -> None:
        """The trust domain's namespace (when it creates one) and its participants' TLS Secrets."""
        name, args = self._resource_name, self._args
        in_cluster = pulumi.ResourceOptions(parent=self, provider=args.kubernetes)
        namespace: k8s.core.v1.Namespace | None = None
        if args.create_namespace:
            # Participant data volumes live here: destroying the stack leaves the namespace.
            namespace = k8s.core.v1.Namespace(
                f"{name}-namespace",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=args.namespace, labels=args.namespace_labels
                ),
                opts=pulumi.ResourceOptions.merge(
                    in_cluster, pulumi.ResourceOptions(retain_on_delete=True)
                ),
            )
        for identity in args.tls:
            tls_secret(
                f"{name}-{identity.secret_name}",
                identity,
                args.namespace,
                {TRUST_DOMAIN_LABEL: args.trust_domain},
                pulumi.ResourceOptions.merge(
                    in_cluster,
                    pulumi.ResourceOptions(depends_on=[namespace] if namespace else []),
                ),
            )

    def _bucket(self, role: aws.iam.Role, key: aws.kms.Key) -> aws.s3.Bucket:
        """The data bucket: owner-enforced, never public, versioned, encrypted with ``key``."""
        name, child, partition = self._resource_name, self._child, self._args.partition
        bucket = aws.s3.Bucket(f"{name}-data", force_destroy=False, opts=child)
        aws.s3.BucketOwnershipControls(
            f"{name}-data",
            bucket=bucket.id,
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
            opts=child,
        )
        public_access = aws.s3.BucketPublicAccessBlock(
            f"{name}-data",
            bucket=bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child,
        )
        aws.s3.BucketVersioning(
            f"{name}-data",
            bucket=bucket.id,
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(
                status="Enabled"
            ),
            opts=child,
        )
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-data",
            bucket=bucket.id,
            rules=[
                aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                    apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                        sse_algorithm="aws:kms", kms_master_key_id=key.arn
                    ),
                    bucket_key_enabled=True,
                )
            ],
            opts=child,
        )
        aws.s3.BucketPolicy(
            f"{name}-data",
            bucket=bucket.id,
            policy=pulumi.Output.all(bucket.arn, role.arn, key.arn).apply(
                lambda parts: bucket_policy(parts[0], parts[1], parts[2], partition)
            ),
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=[public_access])
            ),
        )
        return bucket

    def _pod_identity(self, role: aws.iam.Role, bucket: aws.s3.Bucket, key: aws.kms.Key) -> None:
        """The role's access to the bucket and key, bound to the participants' service account."""
        name, args = self._resource_name, self._args
        aws.iam.RolePolicy(
            f"{name}-participant",
            role=role.name,
            policy=pulumi.Output.all(bucket.arn, key.arn).apply(
                lambda parts: participant_access_policy(parts[0], parts[1], args.partition)
            ),
            opts=self._child,
        )
        aws.eks.PodIdentityAssociation(
            f"{name}-participant",
            cluster_name=args.cluster_name,
            namespace=args.namespace,
            service_account=args.service_account,
            role_arn=role.arn,
            opts=pulumi.ResourceOptions(parent=self, provider=args.cluster_provider),
        )
