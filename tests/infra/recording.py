"""Run the real Pulumi program of one stack under recording mocks and keep what it registered.

No Pulumi CLI and no cloud: ``pulumi.runtime.set_mocks`` replaces the engine. The monitor
records every resource registration (type, name, parent, provider, raw inputs), every
component's registered outputs, and the stack's exports; the mocks answer with plausible
provider-computed outputs (ARNs in the stack's partition, cluster endpoints, repository URLs)
and data-source results, so the program's ``apply`` chains run as they would in a preview.
"""

from __future__ import annotations

import asyncio
import json
import runpy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc
from pulumi.runtime.sync_await import _sync_await

from tests.infra.expected import REFERENCE_CA, REFERENCE_ENDPOINT, stack_config

REPO = Path(__file__).resolve().parents[2]
ACCOUNT = "210987654321"
SECRET_SIG = rpc._special_sig_key
SECRET_VALUE = rpc._special_secret_sig


def _plain(value: Any, secrets: set[str] | None = None, path: str = "") -> Any:
    """Inputs with Pulumi secrets unwrapped; the dotted path of each secret goes to ``secrets``."""
    if isinstance(value, Mapping):
        if value.get(SECRET_SIG) == SECRET_VALUE:
            if secrets is not None:
                secrets.add(path)
            return _plain(value.get("value"), secrets, path)
        return {k: _plain(v, secrets, f"{path}.{k}" if path else k) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, secrets, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


@dataclass
class Registered:
    """One resource registration as the engine would have received it."""

    urn: str
    type: str
    name: str
    parent: str
    provider: str
    custom: bool
    inputs: dict[str, Any]
    secret_paths: set[str] = field(default_factory=set)
    aliased_to_root: bool = False

    @property
    def provider_id(self) -> str:
        """The provider resource's id from a ``urn::id`` provider reference."""
        return self.provider.rsplit("::", 1)[-1] if self.provider else ""


@dataclass
class Capture:
    """Everything one stack registered (and the data sources it called, with their region)."""

    stack: str
    resources: list[Registered] = field(default_factory=list)
    component_outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    exports: dict[str, Any] = field(default_factory=dict)
    secret_exports: set[str] = field(default_factory=set)
    calls: list[tuple[str, str]] = field(default_factory=list)

    def of_type(self, type_: str) -> list[Registered]:
        """Registrations of one type token, in registration order."""
        return [r for r in self.resources if r.type == type_]

    def by_urn(self, urn: str) -> Registered | None:
        """The registration with this URN, or None (the root stack has none)."""
        return next((r for r in self.resources if r.urn == urn), None)

    def ancestors(self, resource: Registered) -> Iterator[Registered]:
        """Parents of a resource, nearest first."""
        parent = self.by_urn(resource.parent)
        while parent is not None:
            yield parent
            parent = self.by_urn(parent.parent)

    def enclosing(self, resource: Registered, type_: str) -> Registered | None:
        """The nearest ancestor of a type (e.g. the ParticipantTrustDomain owning a bucket)."""
        return next((a for a in self.ancestors(resource) if a.type == type_), None)

    def provider_of(self, resource: Registered) -> Registered | None:
        """The explicit provider a resource was registered with."""
        wanted = resource.provider_id
        return next(
            (
                r
                for r in self.resources
                if r.type.startswith("pulumi:providers:") and f"{r.name}-id" == wanted
            ),
            None,
        )

    def children(self, parent: Registered, type_: str) -> list[Registered]:
        """Direct or indirect descendants of a component with a type token."""
        return [r for r in self.of_type(type_) if parent in list(self.ancestors(r))]


class RecordingMonitor(pulumi_mocks.MockMonitor):
    """The mock engine, also recording parents, providers, inputs and component outputs."""

    def __init__(self, mocks: pulumi.runtime.Mocks, capture: Capture) -> None:
        super().__init__(mocks)
        self.capture = capture

    def RegisterResource(self, request: Any) -> Any:
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            secrets: set[str] = set()
            inputs = _plain(rpc.deserialize_properties(request.object), secrets)
            self.capture.resources.append(
                Registered(
                    urn=response.urn,
                    type=request.type,
                    name=request.name,
                    parent=request.parent,
                    provider=request.provider,
                    custom=bool(request.custom),
                    inputs=inputs,
                    secret_paths=secrets,
                    aliased_to_root=any(
                        a.WhichOneof("alias") == "spec"
                        and a.spec.WhichOneof("parent") == "noParent"
                        for a in request.aliases
                    ),
                )
            )
        return response

    def RegisterResourceOutputs(self, request: Any) -> Any:
        outputs = _plain(rpc.deserialize_properties(request.outputs))
        self.capture.component_outputs[request.urn] = outputs
        return super().RegisterResourceOutputs(request)


class PlausibleCloud(pulumi.runtime.Mocks):
    """Provider-computed outputs and data sources, in the stack's partition and regions."""

    def __init__(self, partition: str, capture: Capture, *, sev_snp_offered: bool = True) -> None:
        self.partition = partition
        self.capture = capture
        self.sev_snp_offered = sev_snp_offered
        self.regions: dict[str, str] = {}

    def _region(self, provider_ref: str) -> str:
        return self.regions.get(provider_ref.rsplit("::", 1)[-1], "mock-region-1")

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        inputs = _plain(args.inputs)
        state: dict[str, Any] = dict(inputs)
        resource_id = f"{args.name}-id"
        region = self._region(args.provider or "")
        p = self.partition
        if args.typ == "pulumi:providers:aws":
            self.regions[resource_id] = inputs.get("region", "mock-region-1")
        elif args.typ == "pulumi:pulumi:StackReference":
            state["outputs"] = {
                "coordinatorEndpoint": REFERENCE_ENDPOINT,
                "coordinatorCa": REFERENCE_CA,
            }
            state["secretOutputNames"] = []
        elif args.typ == "aws:s3/bucket:Bucket":
            state["bucket"] = inputs.get("bucket") or f"{args.name}-a1b2c3d"
            state["arn"] = f"arn:{p}:s3:::{state['bucket']}"
            resource_id = state["bucket"]
        elif args.typ == "aws:iam/role:Role":
            state["name"] = inputs.get("name") or f"{args.name}-r0le"
            state["arn"] = f"arn:{p}:iam::{ACCOUNT}:role/{state['name']}"
        elif args.typ == "aws:kms/key:Key":
            state["arn"] = f"arn:{p}:kms:{region}:{ACCOUNT}:key/{args.name}-key"
            state["keyId"] = f"{args.name}-key"
        elif args.typ == "aws:eks/cluster:Cluster":
            state["endpoint"] = f"https://{inputs['name']}.eks.{region}.example"
            state["certificateAuthority"] = {"data": "Q0EK"}
            state["arn"] = f"arn:{p}:eks:{region}:{ACCOUNT}:cluster/{inputs['name']}"
        elif args.typ == "aws:ecr/repository:Repository":
            state["repositoryUrl"] = f"{ACCOUNT}.dkr.ecr.{region}.amazonaws.com/{inputs['name']}"
            state["arn"] = f"arn:{p}:ecr:{region}:{ACCOUNT}:repository/{inputs['name']}"
        elif args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            state["latestVersion"] = 1
        elif args.typ == "aws:ec2/eip:Eip":
            state["publicIp"] = "203.0.113.10"
        elif args.typ.startswith("aws:"):
            module = args.typ.split(":")[1].split("/")[0]
            state.setdefault("arn", f"arn:{p}:{module}:{region}:{ACCOUNT}:{args.name}")
        return resource_id, state

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[Any]]:
        region = self._region(args.provider or "")
        self.capture.calls.append((args.token, region))
        if args.token == "aws:index/getAvailabilityZones:getAvailabilityZones":
            names = [f"{region}{z}" for z in "abc"]
            return {"names": names, "zoneIds": names, "id": region}, []
        if args.token == "aws:ec2/getVpcEndpointService:getVpcEndpointService":
            service = args.args["service"]
            return {"serviceName": f"com.amazonaws.{region}.{service}", "service": service}, []
        if args.token == "aws:ec2/getInstanceTypes:getInstanceTypes":
            wanted = [
                v for f in args.args["filters"] if f["name"] == "instance-type" for v in f["values"]
            ]
            return {"instanceTypes": wanted if self.sev_snp_offered else [], "id": region}, []
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            arn = f"arn:{self.partition}:iam::{ACCOUNT}:user/deployer"
            return {"accountId": ACCOUNT, "arn": arn, "userId": "DEPLOYER", "id": ACCOUNT}, []
        raise AssertionError(f"the program called an unmocked data source: {args.token}")


def run_stack(
    stack: str,
    partition: str,
    extra_config: Mapping[str, Any] | None = None,
    *,
    sev_snp_offered: bool = True,
) -> Capture:
    """Run ``infra/__main__.py`` (the real entry) as stack ``stack`` under recording mocks.

    Args:
        stack: Stack name; its ``Pulumi.<stack>.yaml`` supplies the config.
        partition: AWS partition the mocks build ARNs in (the config's).
        extra_config: Keys added to or replacing the stack file's config (``None`` deletes).
        sev_snp_offered: Whether EC2 offers the requested instance types with AMD SEV-SNP.

    Returns:
        What the program registered and exported.
    """
    capture = Capture(stack)
    mocks = PlausibleCloud(partition, capture, sev_snp_offered=sev_snp_offered)
    # Pulumi runs on the main thread's event loop; an earlier test in this process that used
    # asyncio.run() left none behind (asyncio.run ends with set_event_loop(None)).
    try:
        loop = asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        loop = None
    if loop is None or loop.is_closed():
        asyncio.set_event_loop(asyncio.new_event_loop())
    # set_mocks reuses an existing root stack (and its exports); every run starts clean.
    pulumi.runtime.settings.ROOT.set(None)
    pulumi.runtime.set_mocks(
        mocks,
        project="lensemble",
        stack=stack,
        preview=False,
        monitor=RecordingMonitor(mocks, capture),
    )
    merged = {**stack_config(stack), **(extra_config or {})}
    pulumi.runtime.set_all_config(
        {
            key: value if isinstance(value, str) else json.dumps(value)
            for key, value in merged.items()
            if value is not None
        }
    )

    def program() -> None:
        runpy.run_path(str(REPO / "infra"), run_name="__main__")

    pulumi_mocks.test(program)()
    root = pulumi.runtime.settings.get_root_resource()
    assert root is not None
    for name, value in root.outputs.items():  # type: ignore[attr-defined]
        output = pulumi.Output.from_input(value)
        capture.exports[name] = _sync_await(output.future())
        if _sync_await(output.is_secret()):
            capture.secret_exports.add(name)
    return capture
