"""The Pulumi program: one LensembleConfig rendered onto the stack's target.

- ``local``: an existing kind cluster (``deployment.kube_context``); no cloud resources.
- ``staging`` (role ``all``): one EKS cluster in ``deployment.cloud.region`` running the
  coordinator and every participant, one node group and trust domain per trust domain.
- ``sovereign-prod``: split like the chart. The consortium runs the ``coordinator`` stack (its
  own account, ``deployment.cloud.region``, the coordinator on an AMD SEV-SNP node group); each
  organisation runs a ``participant`` stack in its own account and its participant's pinned
  region, taking the coordinator endpoint and CA from config or a stack reference.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.cluster import Cluster, ClusterArgs
from infra.image_repository import ImageRepository, ImageRepositoryArgs
from infra.naming import namespace_labels
from infra.network import Network, NetworkArgs
from infra.overrides import stack_overrides
from infra.partition import Partition
from infra.placement import node_pools, trust_domain_region
from infra.release import LensembleRelease, LensembleReleaseArgs
from infra.run_record_key import RunRecordKey, RunRecordKeyArgs
from infra.settings import StackSettings, check_against, read_settings
from infra.tls import TlsIdentity, read_identity, tls_secret
from infra.trust_domain import ParticipantTrustDomain, ParticipantTrustDomainArgs
from lensemble.config import LensembleConfig, load_config
from lensemble.errors import ConfigError, ConfigProblem
from lensemble.render.helm_values import pod_config
from lensemble.render.k8s import OVERLAYS_DIR
from lensemble.render.names import (
    RUN_LABEL,
    coordinator_name,
    coordinator_namespace,
    participant_name,
    participant_namespace,
    tls_secret_name,
)


@dataclass(frozen=True)
class Deployment:
    """What a stack deployed, for its outputs (see :func:`main`)."""

    coordinator_endpoint: pulumi.Input[str]
    image_repository_url: pulumi.Input[str]
    participants: dict[str, dict[str, Any]]
    coordinator_ca: pulumi.Input[str] | None = None
    kubeconfig: pulumi.Output[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _problem(settings: StackSettings, key: str, message: str) -> ConfigError:
    return ConfigError([ConfigProblem(key, message, source=settings.stack_file)])


def _read_text(settings: StackSettings, key: str, path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise _problem(
            settings, key, f"{path} cannot be read ({exc.strerror}); point it at a PEM file."
        ) from None


def _namespace(
    config: LensembleConfig, namespace: str, kubernetes: k8s.Provider
) -> k8s.core.v1.Namespace:
    # Coordinator checkpoints live here: destroying the stack leaves the namespace.
    return k8s.core.v1.Namespace(
        f"namespace-{namespace}",
        metadata=k8s.meta.v1.ObjectMetaArgs(name=namespace, labels=namespace_labels(config)),
        opts=pulumi.ResourceOptions(provider=kubernetes, retain_on_delete=True),
    )


def _kustomize_dir(config: LensembleConfig, settings: StackSettings) -> str:
    overlay = OVERLAYS_DIR / config.deployment.environment
    return settings.kustomize_dir or overlay.as_posix()


def with_endpoint(config: LensembleConfig, endpoint: str) -> LensembleConfig:
    """The config a participant stack deploys: it dials the coordinator at ``endpoint``.

    Only ``network.host`` and ``network.port`` change, which the config hash leaves out, so the
    participant and the coordinator still agree on the hash. ``network.download_port`` stays the
    config's: the coordinator's Service (and load balancer) serves the model download there.

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
    return LensembleConfig.model_validate(data)


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


def deploy_local(config: LensembleConfig, settings: StackSettings) -> Deployment:
    """The whole run on an existing kind cluster: namespaces and the release, no cloud."""
    kubernetes = k8s.Provider("kind", context=config.deployment.kube_context)
    helm = settings.deploy_with == "helm"
    namespaces = {coordinator_namespace(config)} | {
        participant_namespace(config, td) for td in config.trust_domains
    }
    created: list[pulumi.Resource] = (
        [_namespace(config, ns, kubernetes) for ns in sorted(namespaces)] if helm else []
    )
    secrets = _coordinator_tls(config, settings, kubernetes, created)
    for td in config.trust_domains:
        for identity in _participant_tls(config, settings, td, None):
            secrets.append(
                tls_secret(
                    f"tls-{identity.secret_name}",
                    identity,
                    participant_namespace(config, td),
                    namespace_labels(config, td),
                    pulumi.ResourceOptions(provider=kubernetes, depends_on=created),
                )
            )
    LensembleRelease(
        "release",
        LensembleReleaseArgs(
            kubernetes=kubernetes,
            config=config,
            mode="all",
            trust_domain=None,
            release_name=config.run.name,
            namespace=coordinator_namespace(config),
            overrides=stack_overrides(namespaces_by_pulumi=helm) if helm else {},
            deploy_with=settings.deploy_with,
            kustomize_dir=_kustomize_dir(config, settings),
            depends_on=(*created, *secrets),
        ),
    )
    return Deployment(
        coordinator_endpoint=_in_cluster_endpoint(config),
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


def _in_cluster_endpoint(config: LensembleConfig) -> str:
    """``host:port`` the chart's pods dial (a loopback host becomes the coordinator Service)."""
    return f"{pod_config(config).network.host}:{config.network.port}"


def _identity(
    config: LensembleConfig,
    settings: StackSettings,
    identity: str,
    ca_certificate: pulumi.Input[str] | None = None,
) -> TlsIdentity:
    assert settings.tls_dir is not None
    return read_identity(
        settings.tls_dir,
        identity,
        tls_secret_name(config, identity),
        source=settings.stack_file,
        ca_certificate=ca_certificate,
    )


def _coordinator_tls(
    config: LensembleConfig,
    settings: StackSettings,
    kubernetes: k8s.Provider,
    namespaces: list[pulumi.Resource],
) -> list[pulumi.Resource]:
    """The coordinator's TLS Secret when the stack was given ``lensemble:tlsDir``."""
    if settings.tls_dir is None or not config.network.tls.enabled:
        return []
    secret = tls_secret(
        "tls-coordinator",
        _identity(config, settings, "coordinator"),
        coordinator_namespace(config),
        namespace_labels(config),
        pulumi.ResourceOptions(provider=kubernetes, depends_on=namespaces),
    )
    return [secret]


def _participant_tls(
    config: LensembleConfig,
    settings: StackSettings,
    trust_domain: str,
    ca_certificate: pulumi.Input[str] | None,
) -> tuple[TlsIdentity, ...]:
    """TLS Secrets of one trust domain's participants, when given ``lensemble:tlsDir``."""
    if settings.tls_dir is None or not config.network.tls.enabled:
        return ()
    return tuple(
        _identity(config, settings, p.id, ca_certificate)
        for p in config.federation.participants
        if p.trust_domain == trust_domain
    )


def deploy_aws(config: LensembleConfig, settings: StackSettings) -> Deployment:
    """A cluster in AWS for the stack's role: everything, the coordinator, or one participant."""
    role = settings.role
    env = config.deployment.environment
    helm = settings.deploy_with == "helm"
    partition = Partition(config.deployment.cloud.partition)
    tags = {
        RUN_LABEL: config.run.name,
        "lensemble.dev/environment": env,
        "lensemble.dev/stack": settings.stack,
    }
    endpoint: pulumi.Input[str] = _in_cluster_endpoint(config)
    ca: pulumi.Input[str] | None = (
        _read_text(settings, "lensemble:caFile", settings.ca_file) if settings.ca_file else None
    )
    if role == "participant":
        assert settings.trust_domain is not None  # read_settings guarantees it
        domains = [settings.trust_domain]
        region = trust_domain_region(config, settings.trust_domain)
        cluster_name = participant_name(config, settings.trust_domain)
        endpoint, ca = coordinator_source(settings)
    else:
        domains = list(config.trust_domains) if role == "all" else []
        region = config.deployment.cloud.region
        cluster_name = config.run.name
    provider = aws.Provider(
        f"aws-{region}",
        region=region,
        allowed_account_ids=[settings.account_id] if settings.account_id else None,
        default_tags=aws.ProviderDefaultTagsArgs(tags=tags),
    )

    # Nodes reach AWS through VPC endpoints. Staging also pulls public images, and a
    # participant dials a coordinator in another account: both leave through one NAT gateway.
    # The sovereign coordinator has no route out; its load balancer only takes connections in.
    nat_egress = role == "participant" or env != "sovereign-prod"
    network = Network(
        "network",
        NetworkArgs(
            provider=provider,
            cidr=settings.vpc_cidr,
            availability_zones=settings.availability_zones,
            public_subnets=nat_egress or bool(settings.coordinator_ingress_cidrs),
            nat_egress=nat_egress,
            tags=tags,
        ),
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
            pools=node_pools(
                config,
                domains,
                with_coordinator=role != "participant",
                system_instance_type=settings.system_instance_type,
                coordinator_instance_type=settings.coordinator_instance_type,
                participant_instance_type=settings.participant_instance_type,
                participant_nodes=settings.participant_nodes,
                stack=settings.stack,
            ),
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

    # A trust domain's own namespace is made by its component; a shared one is made here.
    # With Kustomize the overlay makes them all.
    shared = config.deployment.namespace.strategy == "single"
    created: list[pulumi.Resource] = []
    if helm and (shared or role != "participant"):
        created.append(_namespace(config, coordinator_namespace(config), cluster.kubernetes))
    if role != "participant":
        created += _coordinator_tls(config, settings, cluster.kubernetes, list(created))
    # A participant trusts the coordinator's CA, whatever its own directory holds.
    participant_ca = ca if role == "participant" else None
    trust_domains = {
        td: ParticipantTrustDomain(
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
                namespace_labels=namespace_labels(config, td),
                create_namespace=helm and not shared,
                service_account=participant_name(config, td),
                account_id=settings.account_id,
                tags=tags,
                tls=_participant_tls(config, settings, td, participant_ca),
            ),
            opts=pulumi.ResourceOptions(depends_on=list(created)),
        )
        for td in domains
    }

    # Sovereign-prod signs its run record with a per-run KMS MAC key (docs/run-record.md); the
    # coordinator's release is given the key, so it signs from its first round.
    record_key: RunRecordKey | None = None
    if role != "participant" and env == "sovereign-prod":
        record_key = RunRecordKey(
            "run-record",
            RunRecordKeyArgs(
                run_name=config.run.name,
                partition=partition,
                cluster_name=cluster.name,
                namespace=coordinator_namespace(config),
                service_account=coordinator_name(config),
                tags=tags,
            ),
            opts=pulumi.ResourceOptions(provider=provider),
        )
    coordinator_overrides: pulumi.Input[dict[str, Any]] = {}
    if helm:
        coordinator_overrides = pulumi.Output.from_input(
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
        mode=role,
        trust_domain=None,
        release_name=config.run.name,
        namespace=coordinator_namespace(config),
        overrides=coordinator_overrides,
        deploy_with=settings.deploy_with,
        kustomize_dir=_kustomize_dir(config, settings),
        depends_on=(*created, *trust_domains.values()),
    )
    if role == "participant":
        td = domains[0]
        release = dataclasses.replace(
            release,
            config=pulumi.Output.from_input(endpoint).apply(
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
    LensembleRelease("release", release)

    extra: dict[str, Any] = {"clusterName": cluster.name, "region": region}
    if record_key is not None:
        extra["runRecordKeyArn"] = record_key.key_arn
        extra["runRecordAuditorRoleArn"] = record_key.auditor_role_arn
    if network.nat_public_ip is not None:
        extra["egressIp"] = network.nat_public_ip
    return Deployment(
        coordinator_endpoint=endpoint,
        coordinator_ca=ca,
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
            for p in config.federation.participants
            if p.trust_domain == td
        },
        kubeconfig=cluster.kubeconfig,
        extra=extra,
    )


def main() -> None:
    """Run the program for the current stack and export its outputs.

    Outputs: ``environment``, ``role``, ``coordinatorEndpoint`` (``host:port``),
    ``coordinatorCa`` (PEM, when known), ``kubeconfig`` (secret, cloud stacks),
    ``imageRepositoryUrl``, ``participants`` (per participant id: trust domain, namespace and,
    in the cloud, region, bucket, KMS key ARN and role ARN), and per target ``clusterName``,
    ``region``, ``egressIp`` (participant and staging stacks) or ``kubeContext``.

    Raises:
        ConfigError: The stack config or the LensembleConfig is invalid.
    """
    settings = read_settings()
    config = load_config(settings.config_file)
    check_against(config, settings)
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
