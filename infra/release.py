"""``LensembleRelease``: the chart (or the environment's Kustomize overlay) on a cluster."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

import pulumi
import pulumi_kubernetes as k8s
import yaml

from infra.settings import PROJECT_ROOT
from lensemble.config import LensembleConfig

ReleaseMode = Literal["all", "coordinator", "participant"]
#: The chart every environment deploys (relative to the project root).
CHART_DIR = "charts/lensemble"
#: Seconds Helm waits for the release's resources to become ready before it rolls back.
RELEASE_TIMEOUT_S = 900


@dataclass(frozen=True)
class LensembleReleaseArgs:
    """Inputs of a :class:`LensembleRelease`.

    Attributes:
        kubernetes: Provider of the target cluster.
        config: The config to render (an Output when a participant stack learns the coordinator
            endpoint from a stack reference).
        mode: ``all`` (coordinator and every participant), ``coordinator``, or ``participant``
            (the trust domain's participants only): the split the chart supports.
        trust_domain: The trust domain of a ``participant`` release.
        release_name: Helm release name.
        namespace: Namespace of the Helm release record (and of the coordinator).
        deploy_with: ``helm`` (chart plus rendered values) or ``kustomize`` (an overlay).
        kustomize_dir: Overlay directory relative to the project root, for ``kustomize``.
        depends_on: Resources that must exist first (namespaces, Pod Identity associations).
    """

    kubernetes: k8s.Provider
    config: pulumi.Input[LensembleConfig]
    mode: ReleaseMode
    trust_domain: str | None
    release_name: str
    namespace: str
    deploy_with: Literal["helm", "kustomize"] = "helm"
    kustomize_dir: str | None = None
    depends_on: tuple[pulumi.Resource, ...] = ()


def helm_values(
    config: LensembleConfig, mode: ReleaseMode, trust_domain: str | None
) -> dict[str, Any]:
    """The chart values for one release: exactly ``lensemble render helm-values``.

    Raises:
        ConfigError: The config cannot be rendered for this mode or trust domain.
    """
    from lensemble.render.helm_values import render_helm_values

    values: dict[str, Any] = render_helm_values(config, mode=mode, trust_domain=trust_domain)
    return values


def _from_program_dir(relative: str) -> str:
    # Pulumi may run the program from infra/; a path relative to the working directory keeps
    # the state free of machine-specific absolute paths.
    return os.path.relpath(PROJECT_ROOT / relative)


class LensembleRelease(pulumi.ComponentResource):
    """Deploys Lensemble onto a cluster.

    Either a Helm release of ``charts/lensemble`` with values rendered from the config, or the
    environment's Kustomize overlay.

    Outputs: ``name``, ``namespace``, ``status`` (Helm only).
    """

    def __init__(
        self, name: str, args: LensembleReleaseArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("lensemble:kubernetes:LensembleRelease", name, None, opts)
        child = pulumi.ResourceOptions(
            parent=self, provider=args.kubernetes, depends_on=list(args.depends_on)
        )
        status: pulumi.Output[Any] | None = None
        if args.deploy_with == "helm":
            # A values file, not the values map: Pulumi drops None-valued keys from maps, while
            # Helm gives a null in a values file its own meaning (remove the chart default).
            values_file = pulumi.Output.from_input(args.config).apply(
                lambda config: [
                    pulumi.StringAsset(
                        yaml.safe_dump(
                            helm_values(config, args.mode, args.trust_domain), sort_keys=False
                        )
                    )
                ]
            )
            release = k8s.helm.v3.Release(
                f"{name}-helm",
                name=args.release_name,
                chart=_from_program_dir(CHART_DIR),
                namespace=args.namespace,
                create_namespace=False,
                value_yaml_files=values_file,
                atomic=True,
                cleanup_on_fail=True,
                timeout=RELEASE_TIMEOUT_S,
                opts=child,
            )
            status = release.status
        else:
            if not args.kustomize_dir:
                raise ValueError("deploy_with kustomize needs kustomize_dir")
            k8s.kustomize.v2.Directory(
                f"{name}-kustomize",
                directory=_from_program_dir(args.kustomize_dir),
                opts=child,
            )
        self.release_name = args.release_name
        self.namespace = args.namespace
        self.register_outputs(
            {"name": self.release_name, "namespace": self.namespace, "status": status}
        )
