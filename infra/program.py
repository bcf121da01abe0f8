"""The Pulumi program: one LensembleConfig rendered onto the stack's target.

- ``local``: an existing kind cluster (``deployment.kube_context``); no cloud resources.
- ``staging`` (role ``all``): one EKS cluster in ``deployment.cloud.region`` running the
  coordinator and every participant, one node group and trust domain per participant.
- ``sovereign-prod``: split like the chart. The consortium runs the ``coordinator`` stack (its
  own account, ``deployment.cloud.region``, the coordinator on an AMD SEV-SNP node group); each
  organisation runs a ``participant`` stack in its own account and its participant's pinned
  region, taking the coordinator endpoint and CA from config or a stack reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.cluster import (
    SEV_SNP_FAMILIES,
    Cluster,
    ClusterArgs,
    LoadBalancerIngress,
    NodePool,
    Taint,
    TaintEffect,
    sev_snp_capable,
)
from infra.image_repository import ImageRepository, ImageRepositoryArgs
from infra.naming import (
    CONFIDENTIAL_LABEL,
    POOL_LABEL,
    TRUST_DOMAIN_LABEL,
    coordinator_namespace,
    participant_namespace,
    participant_service_account,
)
from infra.network import Network, NetworkArgs
from infra.partition import Partition
from infra.release import LensembleRelease, LensembleReleaseArgs, ReleaseMode
from infra.settings import StackSettings, read_settings
from infra.trust_domain import ParticipantTrustDomain, ParticipantTrustDomainArgs
from lensemble.config import LensembleConfig, load_config
from lensemble.errors import ConfigError, ConfigProblem

#: Kubernetes taint effects in the EKS API's spelling.
EKS_TAINT_EFFECT: dict[str, TaintEffect] = {
    "NoSchedule": "NO_SCHEDULE",
    "NoExecute": "NO_EXECUTE",
    "PreferNoSchedule": "PREFER_NO_SCHEDULE",
}
SYSTEM_NODES = 2


@dataclass(frozen=True)
class Deployment:
    """What a stack deployed, for its outputs."""

    coordinator_endpoint: pulumi.Input[str] | None
    coordinator_ca: pulumi.Input[str] | None
    kubeconfig: pulumi.Output[str] | None
    image_repository_url: pulumi.Input[str] | None
    participants: dict[str, dict[str, Any]]
    extra: dict[str, Any]


def _problem(settings: StackSettings, key: str, message: str) -> ConfigError:
    return ConfigError([ConfigProblem(key, message, source=settings.stack_file)])


def _config_problem(settings: StackSettings, path: str, message: str) -> ConfigError:
    return ConfigError([ConfigProblem(path, message, source=str(settings.config_file))])


def check_settings(config: LensembleConfig, settings: StackSettings) -> None:
    """Reject stack settings that contradict the config.

    Raises:
        ConfigError: Naming the stack key or config field and the fix.
    """
    env = config.deployment.environment
    if env == "local":
        if settings.role != "all":
            raise _problem(
                settings,
                "lensemble:role",
                f"{settings.role!r} is not supported for local; "
                "use all (one kind cluster runs everything).",
            )
        if not config.deployment.kube_context:
            raise _config_problem(
                settings,
                "deployment.kube_context",
                "is required for the local stack; name the "
                "kind cluster's kubeconfig context, e.g. kind-lensemble.",
            )
    if env == "sovereign-prod" and settings.role == "all":
        raise _problem(
            settings,
            "lensemble:role",
            "'all' is not allowed in sovereign-prod: each "
            "organisation runs its own participant stack in its own account and region; set "
            "lensemble:role to coordinator or participant.",
        )
    if env == "sovereign-prod" and settings.api_allowed_cidrs:
        raise _problem(
            settings,
            "lensemble:apiAllowedCidrs",
            "is not allowed in sovereign-prod, whose API "
            "servers stay private; remove it and run pulumi from inside the VPC.",
        )
    if settings.trust_domain and settings.trust_domain not in config.trust_domains:
        raise _problem(
            settings,
            "lensemble:trustDomain",
            f"{settings.trust_domain!r} is not a trust "
            f"domain of the config; use one of {', '.join(config.trust_domains)}.",
        )
    if (
        config.deployment.confidential_compute
        and settings.role in ("all", "coordinator")
        and not sev_snp_capable(settings.coordinator_instance_type)
    ):
        raise _problem(
            settings,
            "lensemble:coordinatorInstanceType",
            f"{settings.coordinator_instance_type!r} "
            "cannot run AMD SEV-SNP; use an instance type of the "
            f"{', '.join(SEV_SNP_FAMILIES)} families, e.g. m6a.xlarge.",
        )


def trust_domain_region(config: LensembleConfig, trust_domain: str) -> str:
    """The region a trust domain's data is pinned to.

    That is its participants' region, else ``deployment.cloud.region``.

    Raises:
        ConfigError: The trust domain's participants name different regions.
    """
    regions = {p.region for p in config.federation.participants if p.trust_domain == trust_domain}
    pinned = {r for r in regions if r is not None}
    if len(pinned) > 1:
        raise ConfigError(
            [
                ConfigProblem(
                    "federation.participants",
                    f"trust domain '{trust_domain}' spans regions {', '.join(sorted(pinned))}; "
                    "give every participant of one trust domain the same region.",
                )
            ]
        )
    return pinned.pop() if pinned else config.deployment.cloud.region


def participant_pool(
    config: LensembleConfig, trust_domain: str, size: int, instance_type: str
) -> NodePool:
    """The node group of one trust domain.

    Labelled and tainted as ``deployment.trust_domains`` says, and labelled with
    ``lensemble.dev/trust-domain`` in any case.
    """
    placement = config.deployment.trust_domains.get(trust_domain)
    labels = {POOL_LABEL: "participant", TRUST_DOMAIN_LABEL: trust_domain}
    taints: list[Taint] = []
    if placement is not None:
        labels.update(placement.node_selector)
        for toleration in placement.tolerations:
            effect = EKS_TAINT_EFFECT[toleration.effect or "NoSchedule"]
            value = toleration.value if toleration.operator == "Equal" else None
            taints.append(Taint(key=toleration.key, value=value, effect=effect))
    return NodePool(
        name=trust_domain,
        instance_type=instance_type,
        size=size,
        labels=labels,
        taints=tuple(taints),
    )


def _tags(config: LensembleConfig, settings: StackSettings) -> dict[str, str]:
    return {
        "lensemble.dev/run": config.run.name,
        "lensemble.dev/environment": config.deployment.environment,
        "lensemble.dev/stack": settings.stack,
    }


def _namespace(name: str, namespace: str, kubernetes: k8s.Provider) -> k8s.core.v1.Namespace:
    return k8s.core.v1.Namespace(
        name,
        metadata=k8s.meta.v1.ObjectMetaArgs(
            name=namespace, labels={"pod-security.kubernetes.io/enforce": "restricted"}
        ),
        opts=pulumi.ResourceOptions(provider=kubernetes),
    )


def with_endpoint(
    config: LensembleConfig, endpoint: str, image_repository: str | None
) -> LensembleConfig:
    """The config a participant stack deploys.

    It dials the coordinator at ``endpoint`` (``host:port``) and, when given, pulls from the
    image repository of its own region.

    Raises:
        ConfigError: The endpoint is not ``host:port``.
    """
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(
            [
                ConfigProblem(
                    "lensemble:coordinatorEndpoint",
                    f"{endpoint!r} is not host:port; give e.g. coordinator.example.org:50051.",
                )
            ]
        )
    data = config.model_dump(mode="json")
    data["network"] = {**data["network"], "host": host, "port": int(port)}
    if image_repository is not None:
        data["deployment"]["image"] = {
            **data["deployment"]["image"],
            "repository": image_repository,
        }
    return LensembleConfig.model_validate(data)


def deploy_local(config: LensembleConfig, settings: StackSettings) -> Deployment:
    """The whole run on an existing kind cluster: namespaces and the release, no cloud."""
    kubernetes = k8s.Provider("kind", context=config.deployment.kube_context)
    namespaces = {coordinator_namespace(config)} | {
        participant_namespace(config, td) for td in config.trust_domains
    }
    created = [_namespace(f"namespace-{ns}", ns, kubernetes) for ns in sorted(namespaces)]
    LensembleRelease(
        "release",
        LensembleReleaseArgs(
            kubernetes=kubernetes,
            config=config,
            mode="all",
            trust_domain=None,
            release_name=config.run.name,
            namespace=coordinator_namespace(config),
            deploy_with=settings.deploy_with,
            kustomize_dir=settings.kustomize_dir,
            depends_on=tuple(created),
        ),
    )
    return Deployment(
        coordinator_endpoint=f"{config.network.host}:{config.network.port}",
        coordinator_ca=None,
        kubeconfig=None,
        image_repository_url=config.deployment.image.repository,
        participants={
            p.id: {
                "trustDomain": p.trust_domain,
                "namespace": participant_namespace(config, p.trust_domain),
            }
            for p in config.federation.participants
        },
        extra={"kubeContext": config.deployment.kube_context},
    )


def deploy_aws(config: LensembleConfig, settings: StackSettings) -> Deployment:
    """A cluster in AWS for the stack's role (all, coordinator or one participant)."""
    role = settings.role
    partition = Partition(config.deployment.cloud.partition)
    tags = _tags(config, settings)
    td_scope: list[str] = (
        list(config.trust_domains)
        if role == "all"
        else [settings.trust_domain]
        if role == "participant" and settings.trust_domain
        else []
    )
    region = (
        trust_domain_region(config, td_scope[0])
        if role == "participant"
        else config.deployment.cloud.region
    )
    provider = aws.Provider(
        f"aws-{region}",
        region=region,
        allowed_account_ids=[settings.account_id] if settings.account_id else None,
        default_tags=aws.ProviderDefaultTagsArgs(tags=tags),
    )
    network = Network(
        "network",
        NetworkArgs(
            provider=provider,
            cidr=settings.vpc_cidr,
            availability_zones=settings.availability_zones,
            public_subnets=role != "coordinator" or bool(settings.coordinator_ingress_cidrs),
            # staging pulls public images; a participant dials a coordinator in another account.
            nat_egress=role == "participant" or config.deployment.environment != "sovereign-prod",
        ),
    )

    pools = [
        NodePool("system", settings.system_instance_type, SYSTEM_NODES, {POOL_LABEL: "system"})
    ]
    if role != "participant" and config.deployment.confidential_compute:
        pools.append(
            NodePool(
                "coordinator",
                settings.coordinator_instance_type,
                1,
                {POOL_LABEL: "coordinator", CONFIDENTIAL_LABEL: "amd-sev-snp"},
                confidential=True,
            )
        )
    pools += [
        participant_pool(config, td, settings.participant_nodes, settings.participant_instance_type)
        for td in td_scope
    ]
    ingress: tuple[LoadBalancerIngress, ...] = ()
    if role == "coordinator" and settings.coordinator_ingress_cidrs:
        ingress = (
            LoadBalancerIngress(
                port=config.network.port,
                cidrs=settings.coordinator_ingress_cidrs,
                description="Participants reach the coordinator's gRPC endpoint (mutual TLS)",
            ),
        )
    cluster_name = (
        config.run.name if role != "participant" else f"{config.run.name}-{settings.trust_domain}"
    )
    cluster = Cluster(
        "cluster",
        ClusterArgs(
            provider=provider,
            region=region,
            partition=partition,
            cluster_name=cluster_name,
            kubernetes_version=settings.kubernetes_version,
            vpc_id=network.vpc_id,
            subnet_ids=network.private_subnet_ids,
            public_endpoint=bool(settings.api_allowed_cidrs),
            public_access_cidrs=settings.api_allowed_cidrs,
            pools=tuple(pools),
            load_balancer_ingress=ingress,
            tags=tags,
        ),
    )
    image = ImageRepository(
        "image",
        ImageRepositoryArgs(
            provider=provider,
            repository_name=config.deployment.image.repository.rsplit("/", 1)[-1],
            tags=tags,
        ),
    )

    created: list[pulumi.Resource] = []
    shared = config.deployment.namespace.strategy == "single"
    if shared or role != "participant":
        ns = coordinator_namespace(config)
        created.append(_namespace(f"namespace-{ns}", ns, cluster.kubernetes))
    domains: dict[str, ParticipantTrustDomain] = {}
    for td in td_scope:
        domains[td] = ParticipantTrustDomain(
            td,
            ParticipantTrustDomainArgs(
                trust_domain=td,
                participant_ids=tuple(
                    p.id for p in config.federation.participants if p.trust_domain == td
                ),
                region=trust_domain_region(config, td),
                partition=partition,
                cluster_name=cluster.name,
                cluster_provider=provider,
                kubernetes=cluster.kubernetes,
                namespace=participant_namespace(config, td),
                create_namespace=not shared,
                service_account=participant_service_account(config, td),
                account_id=settings.account_id,
                tags=tags,
            ),
            opts=pulumi.ResourceOptions(depends_on=list(created)),
        )
    created += list(domains.values())

    coordinator_ca: pulumi.Input[str] | None = None
    release_config: pulumi.Input[LensembleConfig] = config
    mode: ReleaseMode = role
    if role == "participant":
        endpoint, coordinator_ca = coordinator_source(settings)
        release_config = pulumi.Output.all(endpoint, image.repository_url).apply(
            lambda parts: with_endpoint(config, parts[0], parts[1])
        )
        coordinator_endpoint: pulumi.Input[str] = endpoint
        namespace = participant_namespace(config, td_scope[0])
        release_name = f"{config.run.name}-{td_scope[0]}"
    else:
        coordinator_endpoint = f"{config.network.host}:{config.network.port}"
        if settings.ca_file is not None:
            coordinator_ca = _read_text(settings, "lensemble:caFile", settings.ca_file)
        namespace = coordinator_namespace(config)
        release_name = config.run.name
    LensembleRelease(
        "release",
        LensembleReleaseArgs(
            kubernetes=cluster.kubernetes,
            config=release_config,
            mode=mode,
            trust_domain=td_scope[0] if role == "participant" else None,
            release_name=release_name,
            namespace=namespace,
            deploy_with=settings.deploy_with,
            kustomize_dir=settings.kustomize_dir,
            depends_on=tuple(created),
        ),
    )

    participants: dict[str, dict[str, Any]] = {}
    for td, domain in domains.items():
        for pid in sorted(p.id for p in config.federation.participants if p.trust_domain == td):
            participants[pid] = {
                "trustDomain": td,
                "region": domain.region,
                "namespace": domain.namespace,
                "bucket": domain.bucket,
                "kmsKeyArn": domain.kms_key_arn,
                "roleArn": domain.role_arn,
            }
    extra: dict[str, Any] = {"clusterName": cluster.name, "region": region}
    if network.nat_public_ip is not None:
        extra["egressIp"] = network.nat_public_ip
    if cluster.load_balancer_security_group_id is not None:
        extra["coordinatorLoadBalancerSecurityGroupId"] = cluster.load_balancer_security_group_id
    return Deployment(
        coordinator_endpoint=coordinator_endpoint,
        coordinator_ca=coordinator_ca,
        kubeconfig=cluster.kubeconfig,
        image_repository_url=image.repository_url,
        participants=participants,
        extra=extra,
    )


def _read_text(settings: StackSettings, key: str, path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise _problem(
            settings, key, f"{path} cannot be read ({exc.strerror}); point it at a PEM file."
        ) from None


def coordinator_source(settings: StackSettings) -> tuple[pulumi.Output[str], pulumi.Output[str]]:
    """Endpoint (``host:port``) and CA certificate (PEM) a participant stack uses.

    Each comes from the stack config when given there, else from the coordinator stack's
    ``coordinatorEndpoint`` and ``coordinatorCa`` outputs through a stack reference.

    Raises:
        ConfigError: ``lensemble:coordinatorCaFile`` cannot be read.
    """
    source = settings.coordinator
    assert source is not None  # read_settings guarantees it for participant stacks
    ca_text = (
        _read_text(settings, "lensemble:coordinatorCaFile", source.ca_file)
        if source.ca_file is not None
        else None
    )
    reference = (
        pulumi.StackReference("coordinator", stack_name=source.stack)
        if source.stack is not None and (source.endpoint is None or ca_text is None)
        else None
    )

    def pick(given: str | None, output_name: str) -> pulumi.Output[str]:
        if given is not None:
            return pulumi.Output.from_input(given)
        assert reference is not None
        return reference.require_output(output_name).apply(str)

    return pick(source.endpoint, "coordinatorEndpoint"), pick(ca_text, "coordinatorCa")


def main() -> None:
    """Run the program for the current stack and export its outputs.

    Outputs: ``coordinatorEndpoint``, ``coordinatorCa`` (when known), ``kubeconfig`` (secret,
    cloud stacks), ``participants`` (per participant id: trust domain, region, namespace, bucket,
    KMS key and role), ``imageRepositoryUrl``, and per role ``clusterName``, ``region``,
    ``egressIp``, ``coordinatorLoadBalancerSecurityGroupId`` or ``kubeContext``.

    Raises:
        ConfigError: The stack config or the LensembleConfig is invalid.
    """
    settings = read_settings()
    config = load_config(settings.config_file)
    check_settings(config, settings)
    if config.deployment.environment == "local":
        deployment = deploy_local(config, settings)
    else:
        deployment = deploy_aws(config, settings)
    pulumi.export("environment", config.deployment.environment)
    pulumi.export("role", settings.role)
    pulumi.export("coordinatorEndpoint", deployment.coordinator_endpoint)
    if deployment.coordinator_ca is not None:
        pulumi.export("coordinatorCa", deployment.coordinator_ca)
    if deployment.kubeconfig is not None:
        pulumi.export("kubeconfig", deployment.kubeconfig)
    pulumi.export("imageRepositoryUrl", deployment.image_repository_url)
    pulumi.export("participants", deployment.participants)
    for key, value in deployment.extra.items():
        pulumi.export(key, value)
