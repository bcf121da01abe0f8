"""``LensembleRelease``: the chart (or the environment's Kustomize overlay) on a cluster."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal

import pulumi
import pulumi_kubernetes as k8s
import yaml

from infra.settings import PROJECT_ROOT
from lensemble.config import LensembleConfig
from lensemble.render.helm_values import render_helm_values

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
        namespace: Namespace of the Helm release record.
        overrides: Chart knobs the stack owns, layered over the rendered values (namespaces made
            by Pulumi, the coordinator's load balancer, peers in other clusters, the image
            repository of the participant's region). Empty for the plain render.
        deploy_with: ``helm`` (chart plus rendered values) or ``kustomize`` (an overlay, which
            takes no overrides).
        kustomize_dir: Overlay directory relative to the project root, for ``kustomize``.
        depends_on: Resources that must exist first (namespaces, Pod Identity associations).
    """

    kubernetes: k8s.Provider
    config: pulumi.Input[LensembleConfig]
    mode: ReleaseMode
    trust_domain: str | None
    release_name: str
    namespace: str
    overrides: pulumi.Input[dict[str, Any]] = field(default_factory=dict)
    deploy_with: Literal["helm", "kustomize"] = "helm"
    kustomize_dir: str | None = None
    depends_on: tuple[pulumi.Resource, ...] = ()


def values_file(values: dict[str, Any]) -> pulumi.StringAsset:
    """A Helm values file (YAML) as an asset.

    A file rather than the ``values`` map: Pulumi drops None-valued keys from maps, while Helm
    gives a null in a values file its own meaning (remove the chart default).
    """
    return pulumi.StringAsset(yaml.safe_dump(values, sort_keys=False))


def _from_program_dir(relative: str) -> str:
    # Pulumi may run the program from infra/; a path relative to the working directory keeps
    # the state free of machine-specific absolute paths.
    return os.path.relpath(PROJECT_ROOT / relative)


class LensembleRelease(pulumi.ComponentResource):
    """Deploys Lensemble onto a cluster.

    With Helm: a release of ``charts/lensemble`` with two values files, exactly what
    ``lensemble render helm-values`` writes for the config, mode and trust domain, then the
    stack's overrides (``helm install -f values.yaml -f overrides.yaml``). With Kustomize: the
    environment's overlay as it is.

    Outputs: ``name``, ``namespace``, ``status`` (Helm only).

    Raises:
        ValueError: Kustomize without an overlay directory, or with overrides.
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
            rendered = pulumi.Output.from_input(args.config).apply(
                lambda config: values_file(
                    render_helm_values(config, mode=args.mode, trust_domain=args.trust_domain)
                )
            )
            stack_owned = pulumi.Output.from_input(args.overrides).apply(values_file)
            release = k8s.helm.v3.Release(
                f"{name}-helm",
                name=args.release_name,
                chart=_from_program_dir(CHART_DIR),
                namespace=args.namespace,
                create_namespace=False,
                value_yaml_files=[rendered, stack_owned],
                atomic=True,
                cleanup_on_fail=True,
                timeout=RELEASE_TIMEOUT_S,
                opts=child,
            )
            status = release.status
        else:
            if not args.kustomize_dir:
                raise ValueError("deploy_with kustomize needs kustomize_dir")
            if args.overrides:
                raise ValueError("a Kustomize overlay takes no overrides; deploy with helm")
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
