"""``AwsStack``: a stack's cluster in AWS for its role (everything, coordinator, a participant).

A component around what the function ``deploy_aws`` used to register at the top of the stack:
the regional provider, the network, the cluster, the image repository, the coordinator's
namespace and TLS Secret, each trust domain, the run-record key and the release. Each of them
carries an alias to the stack root, its parent before, so a stack deployed before the component
existed updates in place instead of replacing its resources (Pulumi carries a parent's aliases
to its children).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.cluster import Cluster, ClusterArgs
from infra.deployment import (
    Deployment,
    coordinator_source,
    coordinator_tls,
    in_cluster_endpoint,
    kustomize_dir,
    participant_tls,
    read_text,
    release_namespace,
    with_endpoint,
)
from infra.image_repository import ImageRepository, ImageRepositoryArgs
from infra.naming import namespace_labels
from infra.network import Network, NetworkArgs
from infra.overrides import stack_overrides
from infra.partition import Partition
from infra.placement import node_pools, trust_domain_region
from infra.release import LensembleRelease, LensembleReleaseArgs
from infra.run_record_key import RunRecordKey, RunRecordKeyArgs
from infra.settings import StackSettings
from infra.trust_domain import ParticipantTrustDomain, ParticipantTrustDomainArgs
from lensemble.config import LensembleConfig
from lensemble.render.names import (
    RUN_LABEL,
    coordinator_name,
    coordinator_namespace,
    participant_name,
    participant_namespace,
)


@dataclass(frozen=True)
class AwsStackArgs:
    """Inputs of an :class:`AwsStack`.

    Attributes:
        config: The validated config the stack deploys.
        settings: The stack's checked ``lensemble:*`` settings (role, network, sizes, ...).
    """

    config: LensembleConfig
    settings: StackSettings


@dataclass(frozen=True)
class Target:
    """Where a stack's cluster runs and whom it serves.

    Attributes:
        domains: Trust domains whose participants the cluster runs (none for a coordinator).
        region: AWS region of the cluster.
        cluster_name: Name of the EKS cluster.
        endpoint: ``host:port`` participants dial.
        ca: PEM of the CA the coordinator's certificate chains to, when known.
    """

    domains: list[str]
    region: str
    cluster_name: str
    endpoint: pulumi.Input[str]
    ca: pulumi.Input[str] | None


class AwsStack(pulumi.ComponentResource):
    """A cluster in AWS for the stack's role, and the release on it.

    Outputs: :attr:`deployment`, what the program exports (see ``infra.program.main``).

    Raises:
        ConfigError: A file a stack setting names cannot be read.
    """

    deployment: Deployment

    def __init__(
        self, name: str, args: AwsStackArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("lensemble:aws:Stack", name, None, opts)
        self._config, self._settings = args.config, args.settings
        self._role = args.settings.role
        self._helm = args.settings.deploy_with == "helm"
        self._partition = Partition(args.config.deployment.cloud.partition)
        self._tags = {
            RUN_LABEL: args.config.run.name,
            "lensemble.dev/environment": args.config.deployment.environment,
            "lensemble.dev/stack": args.settings.stack,
        }
        target = self._target()
        provider = aws.Provider(
            f"aws-{target.region}",
            region=target.region,
            allowed_account_ids=[self._settings.account_id] if self._settings.account_id else None,
            default_tags=aws.ProviderDefaultTagsArgs(tags=self._tags),
            opts=self._child(),
        )
        network = self._network(provider)
        cluster = self._cluster(provider, network, target)
        image = ImageRepository(
            "image",
            ImageRepositoryArgs(
                provider=provider,
                repository_name=self._config.deployment.image.repository.rsplit("/", 1)[-1],
                tags=self._tags,
            ),
            opts=self._child(),
        )
        created = self._coordinator_namespace(cluster)
        trust_domains = self._trust_domains(target, provider, cluster, created)
        record_key = self._run_record_key(provider, cluster)
        self._release(target, cluster, image, [*created, *trust_domains.values()], record_key)
        self.deployment = self._deployment(target, network, cluster, image, trust_domains)
        if record_key is not None:
            self.deployment.extra["runRecordKeyArn"] = record_key.key_arn
            self.deployment.extra["runRecordAuditorRoleArn"] = record_key.auditor_role_arn
            self.deployment.extra["runRecordBreakGlassRoleArn"] = record_key.break_glass_role_arn
        self.register_outputs({"clusterName": cluster.name, "region": target.region})

    def _child(self, **more: Any) -> pulumi.ResourceOptions:
        """Options of a direct child: parented here, aliased to the stack root (its old parent)."""
        return pulumi.ResourceOptions(
            parent=self, aliases=[pulumi.Alias(parent=pulumi.ROOT_STACK_RESOURCE)], **more
        )

    def _target(self) -> Target:
        """Where the cluster runs and whom it serves.

        A participant stack: its own trust domain and region, dialing the coordinator it is
        given. Otherwise the config's region, with every trust domain for role ``all``.
        """
        config, settings = self._config, self._settings
        ca: pulumi.Input[str] | None = (
            read_text(settings, "lensemble:caFile", settings.ca_file) if settings.ca_file else None
        )
        if self._role != "participant":
            return Target(
                domains=list(config.trust_domains) if self._role == "all" else [],
                region=config.deployment.cloud.region,
                cluster_name=config.run.name,
                endpoint=in_cluster_endpoint(config),
                ca=ca,
            )
        assert settings.trust_domain is not None  # read_settings guarantees it
        endpoint, ca = coordinator_source(settings, self._child())
        return Target(
            domains=[settings.trust_domain],
            region=trust_domain_region(config, settings.trust_domain),
            cluster_name=participant_name(config, settings.trust_domain),
            endpoint=endpoint,
            ca=ca,
        )

    def _network(self, provider: aws.Provider) -> Network:
        # Nodes reach AWS through VPC endpoints. Staging also pulls public images, and a
        # participant dials a coordinator in another account: both leave through one NAT
        # gateway. The sovereign coordinator has no route out; its load balancer only takes
        # connections in.
        settings = self._settings
        nat_egress = (
            self._role == "participant" or self._config.deployment.environment != "sovereign-prod"
        )
        return Network(
            "network",
            NetworkArgs(
                provider=provider,
                cidr=settings.vpc_cidr,
                availability_zones=settings.availability_zones,
                public_subnets=nat_egress or bool(settings.coordinator_ingress_cidrs),
                nat_egress=nat_egress,
                tags=self._tags,
            ),
            opts=self._child(),
        )

    def _cluster(self, provider: aws.Provider, network: Network, target: Target) -> Cluster:
        settings = self._settings
        return Cluster(
            "cluster",
            ClusterArgs(
                provider=provider,
                region=target.region,
                partition=self._partition,
                cluster_name=target.cluster_name,
                kubernetes_version=settings.kubernetes_version,
                vpc_id=network.vpc_id,
                subnet_ids=network.private_subnet_ids,
                public_endpoint=bool(settings.api_allowed_cidrs),
                public_access_cidrs=settings.api_allowed_cidrs,
                pools=node_pools(
                    self._config,
                    target.domains,
                    with_coordinator=self._role != "participant",
                    system_instance_type=settings.system_instance_type,
                    coordinator_instance_type=settings.coordinator_instance_type,
                    participant_instance_type=settings.participant_instance_type,
                    participant_nodes=settings.participant_nodes,
                    stack=settings.stack,
                ),
                tags=self._tags,
            ),
            opts=self._child(),
        )

    def _coordinator_namespace(self, cluster: Cluster) -> list[pulumi.Resource]:
        """The coordinator's (or the one shared) namespace, and the coordinator's TLS Secret.

        A trust domain's own namespace is made by its component; a shared one is made here.
        With Kustomize the overlay makes them all.
        """
        config = self._config
        shared = config.deployment.namespace.strategy == "single"
        created: list[pulumi.Resource] = []
        if self._helm and (shared or self._role != "participant"):
            created.append(
                release_namespace(
                    config, coordinator_namespace(config), cluster.kubernetes, self._child()
                )
            )
        if self._role != "participant":
            created += coordinator_tls(
                config, self._settings, cluster.kubernetes, list(created), self._child()
            )
        return created

    def _trust_domains(
        self,
        target: Target,
        provider: aws.Provider,
        cluster: Cluster,
        created: list[pulumi.Resource],
    ) -> dict[str, ParticipantTrustDomain]:
        config, settings = self._config, self._settings
        # A participant trusts the coordinator's CA, whatever its own directory holds.
        participant_ca = target.ca if self._role == "participant" else None
        return {
            td: ParticipantTrustDomain(
                td,
                ParticipantTrustDomainArgs(
                    trust_domain=td,
                    participant_ids=tuple(
                        p.id for p in config.federation.participants if p.trust_domain == td
                    ),
                    region=trust_domain_region(config, td),
                    partition=self._partition,
                    cluster_name=cluster.name,
                    cluster_provider=provider,
                    kubernetes=cluster.kubernetes,
                    namespace=participant_namespace(config, td),
                    namespace_labels=namespace_labels(config, td),
                    create_namespace=self._helm
                    and config.deployment.namespace.strategy != "single",
                    service_account=participant_name(config, td),
                    account_id=settings.account_id,
                    tags=self._tags,
                    tls=participant_tls(config, settings, td, participant_ca),
                ),
                opts=self._child(depends_on=list(created)),
            )
            for td in target.domains
        }

    def _run_record_key(self, provider: aws.Provider, cluster: Cluster) -> RunRecordKey | None:
        # Sovereign-prod signs its run record with a per-run KMS MAC key (docs/run-record.md);
        # the coordinator's release is given the key, so it signs from its first round.
        config = self._config
        if self._role == "participant" or config.deployment.environment != "sovereign-prod":
            return None
        return RunRecordKey(
            "run-record",
            RunRecordKeyArgs(
                run_name=config.run.name,
                partition=self._partition,
                cluster_name=cluster.name,
                namespace=coordinator_namespace(config),
                service_account=coordinator_name(config),
                tags=self._tags,
            ),
            opts=self._child(provider=provider),
        )

    def _release(
        self,
        target: Target,
        cluster: Cluster,
        image: ImageRepository,
        depends_on: list[pulumi.Resource],
        record_key: RunRecordKey | None,
    ) -> LensembleRelease:
        """The release of the stack's role.

        A participant's dials ``target.endpoint`` and pulls from this stack's image repository.
        """
        config, settings = self._config, self._settings
        overrides: pulumi.Input[dict[str, Any]] = {}
        if self._helm:
            overrides = pulumi.Output.from_input(
                record_key.key_arn if record_key is not None else ""
            ).apply(
                lambda key_arn: stack_overrides(
                    namespaces_by_pulumi=True,
                    coordinator_ingress_cidrs=settings.coordinator_ingress_cidrs,
                    run_record_kms_key_id=key_arn or None,
                )
            )
        release = LensembleReleaseArgs(
            kubernetes=cluster.kubernetes,
            config=config,
            mode=self._role,
            trust_domain=None,
            release_name=config.run.name,
            namespace=coordinator_namespace(config),
            overrides=overrides,
            deploy_with=settings.deploy_with,
            kustomize_dir=kustomize_dir(config, settings),
            depends_on=tuple(depends_on),
        )
        if self._role == "participant":
            td = target.domains[0]
            release = dataclasses.replace(
                release,
                config=pulumi.Output.from_input(target.endpoint).apply(
                    lambda dialed: with_endpoint(config, dialed)
                ),
                trust_domain=td,
                release_name=participant_name(config, td),
                namespace=participant_namespace(config, td),
                overrides=image.repository_url.apply(
                    lambda url: stack_overrides(
                        namespaces_by_pulumi=True,
                        image_repository=url,
                        coordinator_cidrs=settings.coordinator_cidrs,
                    )
                ),
            )
        return LensembleRelease("release", release, opts=self._child())

    def _deployment(
        self,
        target: Target,
        network: Network,
        cluster: Cluster,
        image: ImageRepository,
        trust_domains: dict[str, ParticipantTrustDomain],
    ) -> Deployment:
        extra: dict[str, Any] = {"clusterName": cluster.name, "region": target.region}
        if network.nat_public_ip is not None:
            extra["egressIp"] = network.nat_public_ip
        return Deployment(
            coordinator_endpoint=target.endpoint,
            coordinator_ca=target.ca,
            image_repository_url=image.repository_url,
            participants={
                p.id: {
                    "trustDomain": td,
                    "region": domain.region,
                    "namespace": domain.namespace,
                    "bucket": domain.bucket,
                    "kmsKeyArn": domain.kms_key_arn,
                    "roleArn": domain.role_arn,
                }
                for td, domain in trust_domains.items()
                for p in self._config.federation.participants
                if p.trust_domain == td
            },
            kubeconfig=cluster.kubeconfig,
            extra=extra,
        )
