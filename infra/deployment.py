"""What a stack deployed, and the pieces every target of the Pulumi program shares.

The namespaces the program makes, the TLS Secrets it writes from ``lensemble:tlsDir``, the
endpoint and CA a participant stack dials, and the Kustomize overlay a stack deploys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.naming import namespace_labels
from infra.settings import StackSettings
from infra.tls import TlsIdentity, read_identity, tls_secret
from lensemble.config import LensembleConfig
from lensemble.errors import ConfigError, ConfigProblem
from lensemble.render.helm_values import pod_config
from lensemble.render.k8s import OVERLAYS_DIR
from lensemble.render.names import coordinator_namespace, tls_secret_name


@dataclass(frozen=True)
class Deployment:
    """What a stack deployed, for its outputs (see :func:`main`)."""

    coordinator_endpoint: pulumi.Input[str]
    image_repository_url: pulumi.Input[str]
    participants: dict[str, dict[str, Any]]
    coordinator_ca: pulumi.Input[str] | None = None
    kubeconfig: pulumi.Output[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def problem(settings: StackSettings, key: str, message: str) -> ConfigError:
    """A problem with stack key ``key``, in the stack's file."""
    return ConfigError([ConfigProblem(key, message, source=settings.stack_file)])


def read_text(settings: StackSettings, key: str, path: Path) -> str:
    """The text of the file stack key ``key`` names.

    Raises:
        ConfigError: The file cannot be read.
    """
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise problem(
            settings, key, f"{path} cannot be read ({exc.strerror}); point it at a PEM file."
        ) from None


def release_namespace(
    config: LensembleConfig,
    namespace: str,
    kubernetes: k8s.Provider,
    opts: pulumi.ResourceOptions | None = None,
) -> k8s.core.v1.Namespace:
    """A namespace the release installs into, kept when the stack is destroyed."""
    # Coordinator checkpoints live here: destroying the stack leaves the namespace.
    return k8s.core.v1.Namespace(
        f"namespace-{namespace}",
        metadata=k8s.meta.v1.ObjectMetaArgs(name=namespace, labels=namespace_labels(config)),
        opts=pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(provider=kubernetes, retain_on_delete=True)
        ),
    )


def kustomize_dir(config: LensembleConfig, settings: StackSettings) -> str:
    """The overlay a Kustomize stack deploys: ``lensemble:kustomizeDir``, else the environment's."""
    overlay = OVERLAYS_DIR / config.deployment.environment
    return settings.kustomize_dir or overlay.as_posix()


def with_endpoint(config: LensembleConfig, endpoint: str) -> LensembleConfig:
    """The config a participant stack deploys: it dials the coordinator at ``endpoint``.

    Only ``network`` changes, which the config hash leaves out, so the participant and the
    coordinator still agree on the hash. At the config's own gRPC port the model download port
    stays the config's: the coordinator's Service (and load balancer) serves it there. An
    endpoint on another port is a front door that maps ports (e.g. 443 to 50051); the
    download port behind it is unknown, so the participant fetches models over gRPC
    FetchModel (``network.download_port: null``, said in a warning) instead of dialing a port
    the front door does not forward and falling back every round.

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
    network = {**data["network"], "host": host, "port": int(port)}
    if int(port) != config.network.port and config.network.download_port is not None:
        network["download_port"] = None
        pulumi.log.warn(
            f"lensemble:coordinatorEndpoint {endpoint} maps the coordinator's gRPC port "
            f"{config.network.port} to {port}; the model download port "
            f"{config.network.download_port} is not known behind it, so participants fetch "
            "each round's model over gRPC FetchModel (slower). Forward the download port too "
            "and dial the coordinator on its own port to use it."
        )
    data["network"] = network
    return LensembleConfig.model_validate(data)


def coordinator_source(
    settings: StackSettings, opts: pulumi.ResourceOptions | None = None
) -> tuple[pulumi.Output[str], pulumi.Output[str]]:
    """Endpoint (``host:port``) and CA certificate (PEM) a participant stack uses.

    Each comes from the stack config when given there, else from the coordinator stack's
    ``coordinatorEndpoint`` and ``coordinatorCa`` outputs through a stack reference.

    Raises:
        ConfigError: ``lensemble:coordinatorCaFile`` cannot be read.
    """
    source = settings.coordinator
    assert source is not None  # read_settings guarantees it for participant stacks
    ca_text = (
        read_text(settings, "lensemble:coordinatorCaFile", source.ca_file)
        if source.ca_file is not None
        else None
    )
    reference = (
        pulumi.StackReference("coordinator", stack_name=source.stack, opts=opts)
        if source.stack is not None and (source.endpoint is None or ca_text is None)
        else None
    )

    def pick(given: str | None, output_name: str) -> pulumi.Output[str]:
        if given is not None:
            return pulumi.Output.from_input(given)
        assert reference is not None
        return reference.require_output(output_name).apply(str)

    return pick(source.endpoint, "coordinatorEndpoint"), pick(ca_text, "coordinatorCa")


def in_cluster_endpoint(config: LensembleConfig) -> str:
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


def coordinator_tls(
    config: LensembleConfig,
    settings: StackSettings,
    kubernetes: k8s.Provider,
    namespaces: list[pulumi.Resource],
    opts: pulumi.ResourceOptions | None = None,
) -> list[pulumi.Resource]:
    """The coordinator's TLS Secret when the stack was given ``lensemble:tlsDir``."""
    if settings.tls_dir is None or not config.network.tls.enabled:
        return []
    secret = tls_secret(
        "tls-coordinator",
        _identity(config, settings, "coordinator"),
        coordinator_namespace(config),
        namespace_labels(config),
        pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(provider=kubernetes, depends_on=namespaces)
        ),
    )
    return [secret]


def participant_tls(
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
