"""What the config says a stack must look like, restated from the documented rules (README,
schema descriptions) rather than imported from the program under test."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from lensemble.config import LensembleConfig

REPO = Path(__file__).resolve().parents[2]

if TYPE_CHECKING:
    from tests.infra.recording import Capture, Registered

TRUST_DOMAIN_TYPE = "lensemble:aws:ParticipantTrustDomain"
#: Endpoint and CA the mocked coordinator stack reference returns.
REFERENCE_ENDPOINT = "coordinator.consortium.example.org:50051"
REFERENCE_CA = "-----BEGIN CERTIFICATE-----\nMOCK\n-----END CERTIFICATE-----\n"
#: AWS services without a region: their resources are exempt from region pinning.
GLOBAL_MODULES = ("iam",)


def stack_config(stack: str) -> dict[str, Any]:
    """The ``config:`` mapping of ``Pulumi.<stack>.yaml``."""
    document = yaml.safe_load((REPO / f"Pulumi.{stack}.yaml").read_text(encoding="utf-8"))
    return dict(document.get("config") or {})


def namespace_of(config: LensembleConfig, trust_domain: str) -> str:
    """Documented: per-trust-domain puts a trust domain in '<name>-<trust_domain>'."""
    ns = config.deployment.namespace
    return f"{ns.name}-{trust_domain}" if ns.strategy == "per-trust-domain" else ns.name


def region_of(config: LensembleConfig, trust_domain: str) -> str:
    """A trust domain's pinned region: its participants' region, else the config's region."""
    regions = {p.region for p in config.federation.participants if p.trust_domain == trust_domain}
    regions.discard(None)
    return regions.pop() if regions else config.deployment.cloud.region


def stack_region(capture: Capture, config: LensembleConfig) -> str:
    """A participant stack runs in its trust domain's region, any other in the config's."""
    domains = capture.of_type(TRUST_DOMAIN_TYPE)
    if capture.exports.get("role") == "participant":
        return region_of(config, domains[0].name)
    return config.deployment.cloud.region


def trust_domain_of(capture: Capture, resource: Registered) -> str | None:
    """The trust domain whose component encloses a resource, if any."""
    owner = capture.enclosing(resource, TRUST_DOMAIN_TYPE)
    return owner.name if owner is not None else None


def policy(document: Any) -> dict[str, Any]:
    """A policy document input, parsed from its JSON string."""
    assert isinstance(document, str), f"policy is not a JSON string: {document!r}"
    parsed = json.loads(document)
    assert isinstance(parsed, dict)
    return parsed


def statements(document: Any) -> list[dict[str, Any]]:
    """The statements of a policy document."""
    found = policy(document)["Statement"]
    return found if isinstance(found, list) else [found]


def as_list(value: Any) -> list[Any]:
    """A policy field that may be a string or a list, as a list."""
    return value if isinstance(value, list) else [value]


def strings_in(value: Any) -> Iterator[str]:
    """Every string in a nested input, with JSON policy documents opened up."""
    if isinstance(value, str):
        yield value
        if value.startswith("{"):
            with contextlib.suppress(ValueError):
                yield from strings_in(json.loads(value))
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings_in(item)
