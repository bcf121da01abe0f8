"""Typed view of one stack's ``lensemble:*`` Pulumi config.

A stack file names the LensembleConfig it deploys (``lensemble:configFile``) and says only what
the config cannot know: which part of a sovereign-prod split this stack is, where the
coordinator lives for a participant stack, who may reach public endpoints, and node sizes.
Credentials never appear here: the AWS providers take them from the environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

import pulumi

from infra.cluster import SEV_SNP_FAMILIES, sev_snp_capable
from lensemble.config import LensembleConfig
from lensemble.errors import ConfigError, ConfigProblem

#: The directory holding ``Pulumi.yaml``; relative paths in stack config resolve from here,
#: whatever working directory Pulumi gives the program.
PROJECT_ROOT = Path(__file__).resolve().parent.parent

Role = Literal["all", "coordinator", "participant"]
DeployWith = Literal["helm", "kustomize"]
ROLES: tuple[Role, ...] = ("all", "coordinator", "participant")
#: CIDRs that mean "every address".
ANYWHERE = ("0.0.0.0/0", "::/0")
DEPLOY_WITH: tuple[DeployWith, ...] = ("helm", "kustomize")


@dataclass(frozen=True)
class CoordinatorSource:
    """Where a participant stack learns the coordinator's endpoint and CA certificate.

    Attributes:
        stack: Fully qualified coordinator stack (``org/lensemble/sovereign-prod``) read through
            a stack reference, or None.
        endpoint: ``host:port`` the participants dial, when given directly.
        ca_file: PEM file (path) of the CA that signed the coordinator, when given directly.
    """

    stack: str | None
    endpoint: str | None
    ca_file: Path | None


@dataclass(frozen=True)
class StackSettings:
    """Everything a stack file may say, validated.

    Attributes:
        stack: The Pulumi stack name.
        config_file: The LensembleConfig file (absolute path).
        role: ``all`` (one cluster runs coordinator and participants: local, staging),
            ``coordinator`` (the consortium's sovereign-prod stack) or ``participant`` (one
            organisation's sovereign-prod stack).
        trust_domain: The participant stack's trust domain; None otherwise.
        coordinator: Where a participant stack finds the coordinator; None otherwise.
        ca_file: PEM CA certificate (path) the coordinator stack publishes to participants.
        deploy_with: ``helm`` (the chart with rendered values) or ``kustomize`` (an overlay).
        kustomize_dir: Overlay directory (relative to the project root) for ``kustomize``;
            None means ``overlays/<environment>``.
        vpc_cidr: IPv4 CIDR of the VPC.
        availability_zones: Private subnets to spread nodes over (count, 2-3).
        api_allowed_cidrs: CIDRs allowed to reach a public EKS endpoint (staging only).
        coordinator_ingress_cidrs: Addresses allowed to reach the coordinator's load balancer on
            ``network.port`` and ``network.download_port`` (a coordinator stack: the
            participants' egress addresses). Empty: the coordinator is reachable inside its
            cluster only.
        coordinator_cidrs: Addresses of the coordinator's load balancer, the only egress a
            participant stack's pods get besides DNS (on those two ports).
        tls_dir: Directory laid out as ``lensemble certs init`` writes it; the stack then
            makes the TLS Secret of every identity it deploys. None: the Secrets are brought
            another way (cert-manager, ``kubectl create secret``).
        account_id: AWS account the providers refuse to leave, when set.
        kubernetes_version: EKS control-plane version.
        system_instance_type: Instance type of the system node group.
        coordinator_instance_type: Instance type of the confidential coordinator node group.
        participant_instance_type: Instance type of each participant node group; None sizes
            it from the config's rank layouts (:mod:`infra.sizing`).
        participant_nodes: Nodes per participant node group (count); None sizes it from the
            config's rank layouts.
    """

    stack: str
    config_file: Path
    role: Role
    trust_domain: str | None
    coordinator: CoordinatorSource | None
    ca_file: Path | None
    deploy_with: DeployWith
    kustomize_dir: str | None
    vpc_cidr: str
    availability_zones: int
    api_allowed_cidrs: tuple[str, ...]
    coordinator_ingress_cidrs: tuple[str, ...]
    coordinator_cidrs: tuple[str, ...]
    tls_dir: Path | None
    account_id: str | None
    kubernetes_version: str
    system_instance_type: str
    coordinator_instance_type: str
    participant_instance_type: str | None
    participant_nodes: int | None

    @property
    def stack_file(self) -> str:
        """The stack file problems are reported against."""
        return f"Pulumi.{self.stack}.yaml"


def _problem(stack: str, key: str, message: str) -> ConfigError:
    return ConfigError([ConfigProblem(f"lensemble:{key}", message, source=f"Pulumi.{stack}.yaml")])


def _resolve(value: str) -> Path:
    path = Path(value)
    return path if path.is_absolute() else PROJECT_ROOT / path


def _path(value: str | None) -> Path | None:
    return None if value is None else _resolve(value)


def _strings(cfg: pulumi.Config, key: str) -> tuple[str, ...]:
    raw = cfg.get_object(key)
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
        raise _problem(
            pulumi.get_stack(), key, f"{raw!r} is not a list of strings; give a YAML list."
        )
    return tuple(cast(list[str], raw))


def _choice(cfg: pulumi.Config, key: str, default: str, choices: tuple[str, ...]) -> str:
    """The value of ``key``, one of ``choices``.

    Raises:
        ConfigError: It is none of them.
    """
    value = cfg.get(key, default)
    if value not in choices:
        raise _problem(
            pulumi.get_stack(),
            key,
            f"{value!r} is not allowed; use one of {', '.join(choices)}.",
        )
    return value


def _coordinator_source(
    cfg: pulumi.Config, role: str, trust_domain: str | None
) -> CoordinatorSource | None:
    """Where a participant stack finds the coordinator; None for other roles.

    Raises:
        ConfigError: A participant stack lacks its trust domain or a coordinator source, or
            another role names a trust domain.
    """
    stack = pulumi.get_stack()
    if role != "participant":
        if trust_domain:
            raise _problem(
                stack,
                "trustDomain",
                "only applies to role participant; remove it or set lensemble:role: participant.",
            )
        return None
    if not trust_domain:
        raise _problem(
            stack,
            "trustDomain",
            "is required for a participant stack; set it to this "
            "organisation's trust domain from the config.",
        )
    source = CoordinatorSource(
        stack=cfg.get("coordinatorStack"),
        endpoint=cfg.get("coordinatorEndpoint"),
        ca_file=_path(cfg.get("coordinatorCaFile")),
    )
    if source.stack is None and (source.endpoint is None or source.ca_file is None):
        raise _problem(
            stack,
            "coordinatorStack",
            "is missing; a participant stack needs the "
            "coordinator stack to reference, or both lensemble:coordinatorEndpoint and "
            "lensemble:coordinatorCaFile.",
        )
    return source


def _sizes(cfg: pulumi.Config) -> tuple[int, int | None]:
    """``availabilityZones`` (2..3, default 3) and ``participantNodes`` (at least 1, or unset).

    Raises:
        ConfigError: Either is out of range.
    """
    stack = pulumi.get_stack()
    zones = cfg.get_int("availabilityZones", 3)
    if not 2 <= zones <= 3:
        raise _problem(stack, "availabilityZones", f"{zones} is outside 2..3; choose 2 or 3.")
    nodes = cfg.get_int("participantNodes")
    if nodes is not None and nodes < 1:
        raise _problem(stack, "participantNodes", f"{nodes} is below 1; give at least 1.")
    return zones, nodes


def read_settings() -> StackSettings:
    """Read and check the current stack's ``lensemble:*`` config.

    Returns:
        The validated settings.

    Raises:
        ConfigError: A key is missing, has a value outside its choices, or contradicts another
            (each problem names the key and the stack file).
    """
    stack = pulumi.get_stack()
    cfg = pulumi.Config("lensemble")
    config_file = _path(cfg.get("configFile"))
    if config_file is None:
        raise _problem(
            stack,
            "configFile",
            "is required; name the LensembleConfig file, e.g. config/staging.yaml.",
        )
    role = cast(Role, _choice(cfg, "role", "all", ROLES))
    deploy_with = cast(DeployWith, _choice(cfg, "deployWith", "helm", DEPLOY_WITH))
    trust_domain = cfg.get("trustDomain")
    coordinator = _coordinator_source(cfg, role, trust_domain)
    zones, nodes = _sizes(cfg)
    return StackSettings(
        stack=stack,
        config_file=config_file,
        role=role,
        trust_domain=trust_domain,
        coordinator=coordinator,
        ca_file=_path(cfg.get("caFile")),
        deploy_with=deploy_with,
        kustomize_dir=cfg.get("kustomizeDir"),
        vpc_cidr=cfg.get("vpcCidr", "10.40.0.0/16"),
        availability_zones=zones,
        api_allowed_cidrs=_strings(cfg, "apiAllowedCidrs"),
        coordinator_ingress_cidrs=_strings(cfg, "coordinatorIngressCidrs"),
        coordinator_cidrs=_strings(cfg, "coordinatorCidrs"),
        tls_dir=_path(cfg.get("tlsDir")),
        account_id=cfg.get("accountId"),
        kubernetes_version=cfg.get("kubernetesVersion", "1.33"),
        system_instance_type=cfg.get("systemInstanceType", "m6i.large"),
        coordinator_instance_type=cfg.get("coordinatorInstanceType", "m6a.xlarge"),
        participant_instance_type=cfg.get("participantInstanceType"),
        participant_nodes=nodes,
    )


def _check_environment(config: LensembleConfig, settings: StackSettings) -> None:
    """Local runs everything on a named kind cluster; sovereign-prod splits roles, stays private."""
    env = config.deployment.environment
    if env == "local" and settings.role != "all":
        raise _problem(
            settings.stack,
            "role",
            f"{settings.role!r} is not supported for local; use all (one kind cluster runs "
            "everything).",
        )
    if env == "local" and not config.deployment.kube_context:
        raise ConfigError(
            [
                ConfigProblem(
                    "deployment.kube_context",
                    "is required for the local stack; name the kind cluster's kubeconfig "
                    "context, e.g. kind-lensemble.",
                    source=str(settings.config_file),
                )
            ]
        )
    if env == "sovereign-prod" and settings.role == "all":
        raise _problem(
            settings.stack,
            "role",
            "'all' is not allowed in sovereign-prod: each organisation runs its own participant "
            "stack in its own account and region; set lensemble:role to coordinator or "
            "participant.",
        )
    if env == "sovereign-prod" and settings.api_allowed_cidrs:
        raise _problem(
            settings.stack,
            "apiAllowedCidrs",
            "is not allowed in sovereign-prod, whose API servers stay private; remove it and "
            "run pulumi from a network that reaches the VPC.",
        )


def _check_deploy_with(settings: StackSettings) -> None:
    """Kustomize deploys the whole run's overlay, which makes the namespaces itself."""
    if settings.deploy_with == "kustomize" and settings.role != "all":
        raise _problem(
            settings.stack,
            "deployWith",
            "'kustomize' deploys an overlay of the whole run (mode all); a coordinator or "
            "participant stack deploys the chart: use helm.",
        )
    if settings.deploy_with == "kustomize" and settings.tls_dir is not None:
        raise _problem(
            settings.stack,
            "tlsDir",
            "does not combine with deployWith kustomize: the overlay makes the namespaces the "
            "Secrets go to; create them after the overlay (as python -m tools.kind up does) or "
            "deploy with helm.",
        )


def _check_coordinator(config: LensembleConfig, settings: StackSettings) -> None:
    """The coordinator is never open to the internet in sovereign-prod, and runs on SEV-SNP."""
    for key, cidrs in (
        ("coordinatorIngressCidrs", settings.coordinator_ingress_cidrs),
        ("coordinatorCidrs", settings.coordinator_cidrs),
    ):
        if config.deployment.environment == "sovereign-prod" and any(c in ANYWHERE for c in cidrs):
            raise _problem(
                settings.stack,
                key,
                "opens the coordinator to the whole internet, which sovereign-prod refuses; "
                "list the participants' egress addresses (their stacks' egressIp).",
            )
    coordinator_here = settings.role in ("all", "coordinator")
    if (
        coordinator_here
        and config.deployment.confidential_compute
        and not sev_snp_capable(settings.coordinator_instance_type)
    ):
        raise _problem(
            settings.stack,
            "coordinatorInstanceType",
            f"{settings.coordinator_instance_type!r} cannot run AMD SEV-SNP; use an instance "
            f"type of the {', '.join(SEV_SNP_FAMILIES)} families, e.g. m6a.xlarge.",
        )


def check_against(config: LensembleConfig, settings: StackSettings) -> None:
    """Reject stack settings that contradict the config they deploy.

    Raises:
        ConfigError: Naming the stack key (or config field) and the fix.
    """
    _check_environment(config, settings)
    if settings.trust_domain and settings.trust_domain not in config.trust_domains:
        raise _problem(
            settings.stack,
            "trustDomain",
            f"{settings.trust_domain!r} is not a trust domain of {settings.config_file.name}; "
            f"use one of {', '.join(config.trust_domains)}.",
        )
    _check_deploy_with(settings)
    _check_coordinator(config, settings)
