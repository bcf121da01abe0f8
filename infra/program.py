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

import pulumi
import pulumi_kubernetes as k8s

from infra.aws_stack import AwsStack, AwsStackArgs
from infra.deployment import (
    Deployment,
    coordinator_source,
    coordinator_tls,
    in_cluster_endpoint,
    kustomize_dir,
    participant_tls,
    release_namespace,
    with_endpoint,
)
from infra.naming import namespace_labels
from infra.overrides import stack_overrides
from infra.release import LensembleRelease, LensembleReleaseArgs
from infra.settings import StackSettings, check_against, read_settings
from infra.tls import tls_secret
from lensemble.config import LensembleConfig, load_config
from lensemble.render.names import coordinator_namespace, participant_namespace

#: Kept importable from here: the participant stack's view of the coordinator.
__all__ = ["coordinator_source", "deploy_aws", "deploy_local", "main", "with_endpoint"]


def deploy_local(config: LensembleConfig, settings: StackSettings) -> Deployment:
    """The whole run on an existing kind cluster: namespaces and the release, no cloud."""
    kubernetes = k8s.Provider("kind", context=config.deployment.kube_context)
    helm = settings.deploy_with == "helm"
    namespaces = {coordinator_namespace(config)} | {
        participant_namespace(config, td) for td in config.trust_domains
    }
    created: list[pulumi.Resource] = (
        [release_namespace(config, ns, kubernetes) for ns in sorted(namespaces)] if helm else []
    )
    secrets = coordinator_tls(config, settings, kubernetes, created)
    for td in config.trust_domains:
        for identity in participant_tls(config, settings, td, None):
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
            kustomize_dir=kustomize_dir(config, settings),
            depends_on=(*created, *secrets),
        ),
    )
    return Deployment(
        coordinator_endpoint=in_cluster_endpoint(config),
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
    """A cluster in AWS for the stack's role: everything, the coordinator, or one participant.

    Registers an :class:`~infra.aws_stack.AwsStack` component (``lensemble:aws:Stack``) whose
    children alias their former place at the stack root.
    """
    return AwsStack("aws", AwsStackArgs(config=config, settings=settings)).deployment


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
