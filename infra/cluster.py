"""``Cluster``: EKS with audit logs, Pod Identity and one managed node group per purpose."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.partition import Partition
from lensemble.render.names import POOL_LABEL

#: Instance families that can launch with AMD SEV-SNP (EC2 User Guide, "AMD SEV-SNP").
SEV_SNP_FAMILIES = ("m6a", "c6a", "r6a")
#: Every control-plane log type, so the audit trail is complete.
CONTROL_PLANE_LOGS = ("api", "audit", "authenticator", "controllerManager", "scheduler")
TaintEffect = Literal["NO_SCHEDULE", "NO_EXECUTE", "PREFER_NO_SCHEDULE"]


def sev_snp_capable(instance_type: str) -> bool:
    """Whether an EC2 instance type (e.g. ``m6a.xlarge``) belongs to an AMD SEV-SNP family."""
    return instance_type.split(".", 1)[0] in SEV_SNP_FAMILIES


def offered_with_sev_snp(offered: Sequence[str], instance_type: str, region: str) -> str:
    """``instance_type`` when the region offers it with AMD SEV-SNP.

    SEV-SNP is offered in a few regions only, so this is checked against EC2 at preview time
    rather than assumed.

    Args:
        offered: Instance types EC2 lists with the ``amd-sev-snp`` feature in the region.
        instance_type: The confidential pool's instance type.
        region: The cluster's region.

    Raises:
        ValueError: The region does not offer the instance type with SEV-SNP.
    """
    if instance_type not in offered:
        raise ValueError(
            f"{instance_type} is not offered with AMD SEV-SNP in {region}; run the coordinator "
            "stack in a region that offers it (aws ec2 describe-instance-types --filters "
            "Name=processor-info.supported-features,Values=amd-sev-snp) or change "
            "lensemble:coordinatorInstanceType."
        )
    return instance_type


@dataclass(frozen=True)
class Taint:
    """A node taint (EKS spelling of the effect)."""

    key: str
    value: str | None
    effect: TaintEffect


@dataclass(frozen=True)
class NodePool:
    """One managed node group.

    Attributes:
        name: Short name, unique in the cluster (``system``, ``coordinator``, a trust domain).
        instance_type: EC2 instance type.
        size: Nodes (count); the group scales between ``size`` and ``size`` + 1 during updates.
        labels: Kubernetes node labels.
        taints: Kubernetes node taints.
        confidential: Launch with AMD SEV-SNP; the instance type must be SEV-SNP capable.
        gpu: NVIDIA GPU nodes: the EKS AMI with the NVIDIA driver and device plugin.
    """

    name: str
    instance_type: str
    size: int
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    confidential: bool = False
    gpu: bool = False


@dataclass(frozen=True)
class ClusterArgs:
    """Inputs of a :class:`Cluster`.

    Attributes:
        provider: AWS provider pinned to the cluster's region.
        region: The cluster's region (the kubeconfig asks for tokens there).
        partition: ARN partition.
        cluster_name: EKS cluster name.
        kubernetes_version: Control-plane version, e.g. ``1.33``.
        vpc_id: VPC of the cluster.
        subnet_ids: Private subnets for the control-plane ENIs and every node.
        public_endpoint: Expose the API server publicly (never in sovereign-prod).
        public_access_cidrs: Who may reach a public API server.
        pools: The node groups.
        tags: Tags on every resource.
    """

    provider: aws.Provider
    region: str
    partition: Partition
    cluster_name: str
    kubernetes_version: str
    vpc_id: pulumi.Input[str]
    subnet_ids: Sequence[pulumi.Input[str]]
    public_endpoint: bool
    public_access_cidrs: tuple[str, ...]
    pools: tuple[NodePool, ...]
    tags: dict[str, str] | None = None


def _assume_role_policy(service: str, *actions: str) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": service},
                    "Action": list(actions) or ["sts:AssumeRole"],
                }
            ],
        }
    )


def kubeconfig(name: str, endpoint: str, ca_data: str, region: str) -> str:
    """A kubeconfig (JSON) that gets tokens from ``aws eks get-token`` with ambient credentials.

    Args:
        name: Cluster name.
        endpoint: API server URL.
        ca_data: Base64 PEM of the cluster CA.
        region: Region of the cluster.

    Returns:
        The kubeconfig document.
    """
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": name,
                    "cluster": {"server": endpoint, "certificate-authority-data": ca_data},
                }
            ],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
            "current-context": name,
            "users": [
                {
                    "name": name,
                    "user": {
                        "exec": {
                            "apiVersion": "client.authentication.k8s.io/v1beta1",
                            "command": "aws",
                            "args": [
                                "eks",
                                "get-token",
                                "--cluster-name",
                                name,
                                "--region",
                                region,
                            ],
                        }
                    },
                }
            ],
        }
    )


class Cluster(pulumi.ComponentResource):
    """EKS control plane and managed node groups.

    The API server logs every control-plane log type (audit included) to CloudWatch, encrypts
    Secrets with its own KMS key, authenticates with access entries, and runs the Pod Identity
    agent so each participant's pods get only their own AWS role. Every node group launches
    from a template that requires IMDSv2 with a hop limit of 1 (pods cannot reach the node's
    credentials) and encrypts the root volume; a confidential pool also enables AMD SEV-SNP.

    Outputs: ``name``, ``endpoint``, ``kubeconfig`` (secret), ``node_role_arn``;
    :attr:`kubernetes` is the provider for the cluster.

    Raises:
        ValueError: A confidential pool's instance type is not SEV-SNP capable.
    """

    def __init__(
        self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("lensemble:aws:Cluster", name, None, opts)
        for pool in args.pools:
            if pool.confidential and not sev_snp_capable(pool.instance_type):
                raise ValueError(
                    f"node pool {pool.name!r}: {pool.instance_type} cannot run AMD SEV-SNP; use "
                    f"an instance type of the {', '.join(SEV_SNP_FAMILIES)} families"
                )
        self._resource_name = name
        self._args = args
        self._child = pulumi.ResourceOptions(parent=self, provider=args.provider)
        self._tags = dict(args.tags or {})
        cluster = self._control_plane()
        node_role, node_policies = self._node_role()
        self.node_groups: dict[str, aws.eks.NodeGroup] = {
            pool.name: self._node_group(pool, cluster, node_role, node_policies)
            for pool in args.pools
        }
        self.name = cluster.name
        self.endpoint = cluster.endpoint
        self.node_role_arn = node_role.arn
        document: pulumi.Output[str] = pulumi.Output.all(
            cluster.name, cluster.endpoint, cluster.certificate_authority.data
        ).apply(lambda parts: kubeconfig(parts[0], parts[1], parts[2], args.region))
        self.kubeconfig: pulumi.Output[str] = pulumi.Output.secret(document)
        self.kubernetes = k8s.Provider(
            f"{name}-kubernetes",
            kubeconfig=self.kubeconfig,
            enable_server_side_apply=True,
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(self.node_groups.values())),
        )
        self.register_outputs(
            {
                "name": self.name,
                "endpoint": self.endpoint,
                "kubeconfig": self.kubeconfig,
                "node_role_arn": self.node_role_arn,
            }
        )

    def _control_plane(self) -> aws.eks.Cluster:
        """The EKS control plane: its role, Secrets key, log group, and Pod Identity agent."""
        name, args, child, tags = self._resource_name, self._args, self._child, self._tags
        cluster_role = aws.iam.Role(
            f"{name}-control-plane",
            assume_role_policy=_assume_role_policy(
                "eks.amazonaws.com", "sts:AssumeRole", "sts:TagSession"
            ),
            tags=tags,
            opts=child,
        )
        attachment = aws.iam.RolePolicyAttachment(
            f"{name}-control-plane",
            role=cluster_role.name,
            policy_arn=args.partition.managed_policy("AmazonEKSClusterPolicy"),
            opts=child,
        )
        secrets_key = aws.kms.Key(
            f"{name}-secrets",
            description=f"Envelope encryption of Kubernetes Secrets in {args.cluster_name}",
            enable_key_rotation=True,
            deletion_window_in_days=30,
            tags=tags,
            opts=child,
        )
        logs = aws.cloudwatch.LogGroup(
            f"{name}-control-plane",
            name=f"/aws/eks/{args.cluster_name}/cluster",
            retention_in_days=365,
            tags=tags,
            opts=child,
        )
        cluster = aws.eks.Cluster(
            f"{name}-eks",
            name=args.cluster_name,
            version=args.kubernetes_version,
            role_arn=cluster_role.arn,
            vpc_config=aws.eks.ClusterVpcConfigArgs(
                subnet_ids=list(args.subnet_ids),
                endpoint_private_access=True,
                endpoint_public_access=args.public_endpoint,
                public_access_cidrs=list(args.public_access_cidrs)
                if args.public_endpoint
                else None,
            ),
            access_config=aws.eks.ClusterAccessConfigArgs(
                authentication_mode="API",
                bootstrap_cluster_creator_admin_permissions=True,
            ),
            encryption_config=aws.eks.ClusterEncryptionConfigArgs(
                provider=aws.eks.ClusterEncryptionConfigProviderArgs(key_arn=secrets_key.arn),
                resources=["secrets"],
            ),
            enabled_cluster_log_types=list(CONTROL_PLANE_LOGS),
            tags=tags,
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=[attachment, logs])
            ),
        )
        aws.eks.Addon(
            f"{name}-pod-identity-agent",
            cluster_name=cluster.name,
            addon_name="eks-pod-identity-agent",
            tags=tags,
            opts=child,
        )
        return cluster

    def _node_role(self) -> tuple[aws.iam.Role, list[aws.iam.RolePolicyAttachment]]:
        """The nodes' IAM role and its managed policies (worker, CNI, registry read)."""
        name, child = self._resource_name, self._child
        node_role = aws.iam.Role(
            f"{name}-nodes",
            assume_role_policy=_assume_role_policy("ec2.amazonaws.com"),
            tags=self._tags,
            opts=child,
        )
        policies = [
            aws.iam.RolePolicyAttachment(
                f"{name}-nodes-{policy}",
                role=node_role.name,
                policy_arn=self._args.partition.managed_policy(policy),
                opts=child,
            )
            for policy in (
                "AmazonEKSWorkerNodePolicy",
                "AmazonEKS_CNI_Policy",
                "AmazonEC2ContainerRegistryReadOnly",
            )
        ]
        return node_role, policies

    def _instance_type(self, pool: NodePool) -> pulumi.Input[str]:
        """The pool's instance type; for a confidential pool, checked to offer SEV-SNP here."""
        if not pool.confidential:
            return pool.instance_type
        offered = aws.ec2.get_instance_types_output(
            filters=[
                aws.ec2.GetInstanceTypesFilterArgs(
                    name="processor-info.supported-features", values=["amd-sev-snp"]
                ),
                aws.ec2.GetInstanceTypesFilterArgs(
                    name="instance-type", values=[pool.instance_type]
                ),
            ],
            opts=pulumi.InvokeOutputOptions(parent=self, provider=self._args.provider),
        )
        return offered.instance_types.apply(
            functools.partial(
                offered_with_sev_snp, instance_type=pool.instance_type, region=self._args.region
            )
        )

    def _launch_template(self, pool: NodePool) -> aws.ec2.LaunchTemplate:
        """IMDSv2 with hop limit 1, an encrypted root volume, SEV-SNP for a confidential pool."""
        return aws.ec2.LaunchTemplate(
            f"{self._resource_name}-{pool.name}",
            instance_type=self._instance_type(pool),
            cpu_options=(
                aws.ec2.LaunchTemplateCpuOptionsArgs(amd_sev_snp="enabled")
                if pool.confidential
                else None
            ),
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_endpoint="enabled",
                http_tokens="required",
                http_put_response_hop_limit=1,
            ),
            block_device_mappings=[
                aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                    device_name="/dev/xvda",
                    ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                        encrypted="true", volume_size=50, volume_type="gp3"
                    ),
                )
            ],
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(
                    resource_type="instance", tags={**self._tags, POOL_LABEL: pool.name}
                )
            ],
            tags=self._tags,
            opts=self._child,
        )

    def _node_group(
        self,
        pool: NodePool,
        cluster: aws.eks.Cluster,
        node_role: aws.iam.Role,
        node_policies: list[aws.iam.RolePolicyAttachment],
    ) -> aws.eks.NodeGroup:
        """One managed node group of ``pool.size`` nodes from the pool's launch template."""
        template = self._launch_template(pool)
        return aws.eks.NodeGroup(
            f"{self._resource_name}-{pool.name}",
            cluster_name=cluster.name,
            node_role_arn=node_role.arn,
            subnet_ids=list(self._args.subnet_ids),
            ami_type="AL2023_x86_64_NVIDIA" if pool.gpu else "AL2023_x86_64_STANDARD",
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                id=template.id, version=template.latest_version.apply(str)
            ),
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                desired_size=pool.size, min_size=pool.size, max_size=pool.size + 1
            ),
            labels=pool.labels,
            taints=[
                aws.eks.NodeGroupTaintArgs(key=t.key, value=t.value, effect=t.effect)
                for t in pool.taints
            ],
            tags={**self._tags, POOL_LABEL: pool.name},
            opts=pulumi.ResourceOptions.merge(
                self._child, pulumi.ResourceOptions(depends_on=node_policies)
            ),
        )
