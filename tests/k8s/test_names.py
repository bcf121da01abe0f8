"""Helm renders every object under the name ``lensemble.render.names`` computes.

The chart computes no name: ``lensemble render helm-values`` passes them in ``names:``. Adversarial
inputs (the longest run names and trust domains, double hyphens, a hyphen exactly where a long
name is cut, names one character either side of the limit) are rendered through Helm and every
object's name compared with Python's.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from lensemble.config import LensembleConfig
from lensemble.config.load import validate_mapping
from lensemble.render.helm_values import render_helm_values
from lensemble.render.k8s import render_chart
from lensemble.render.names import (
    COMPONENT_LABEL,
    KEPT_PREFIX,
    MAX_OBJECT_NAME,
    TRUST_DOMAIN_LABEL,
    coordinator_name,
    coordinator_namespace,
    participant_name,
    participant_namespace,
    safe_name,
    tls_secret_name,
)
from tests.k8s.renders import config_of
from tests.support.tools import require

#: (run name, four trust domains): every case is valid config; each stresses the cut.
ADVERSARIAL = {
    # The case: the 43-character cut ends in "--"; Go's trimSuffix drops one hyphen.
    "double-hyphen-at-cut": ("r" * 39, ("x--" + "y" * 27, "x--" + "z" * 27, "a", "b")),
    # Both at their maximum length (40 + 1 + 30 = 71 characters).
    "maximum-lengths": ("r" * 40, ("a" * 30, "b" * 30, "c" * 30, "d" * 30)),
    # A single hyphen exactly at the cut, and hyphen runs everywhere else.
    "hyphen-at-cut": ("q" * 40, ("a-" + "b" * 28, "a--b--c--d--e--f--g--h--i--j-k", "z-z", "y")),
    # One character under, at and over the limit of 52.
    "around-the-limit": (
        "n" * 30,
        ("t" * (MAX_OBJECT_NAME - 31), "u" * (MAX_OBJECT_NAME - 30), "v" * 30, "w"),
    ),
}


def _config(base: str, run: str, domains: tuple[str, ...]) -> LensembleConfig:
    data: dict[str, Any] = config_of(base).model_dump(mode="json")
    data["run"]["name"] = run
    data["deployment"]["trust_domains"] = {}
    participants = data["federation"]["participants"]
    for participant, domain in zip(participants, domains, strict=True):
        participant["trust_domain"] = domain
    return validate_mapping(data, source="<adversarial>")


def _named(docs: list[dict[str, Any]], kind: str) -> dict[tuple[str, str], str]:
    """(component, trust domain) -> name of every object of one kind."""
    out = {}
    for doc in docs:
        if doc["kind"] == kind:
            labels = doc["metadata"].get("labels") or {}
            key = (labels.get(COMPONENT_LABEL, ""), labels.get(TRUST_DOMAIN_LABEL, ""))
            out[key] = doc["metadata"]["name"]
    return out


@pytest.mark.parametrize("base", ["helm-local", "helm-sovereign-prod"])
@pytest.mark.parametrize("case", sorted(ADVERSARIAL))
def test_helm_and_python_name_every_object_alike(case: str, base: str) -> None:
    require("helm")
    run, domains = ADVERSARIAL[case]
    cfg = _config(base, run, domains)
    docs = render_chart(render_helm_values(cfg), source=case)
    expected = {("participant", td): participant_name(cfg, td) for td in domains}
    expected[("coordinator", "")] = coordinator_name(cfg)
    participants = {k: v for k, v in expected.items() if k[0] == "participant"}
    assert _named(docs, "StatefulSet") == participants
    assert _named(docs, "Deployment") == {("coordinator", ""): coordinator_name(cfg)}
    for kind in ("Service", "ServiceAccount"):
        assert _named(docs, kind) == expected, kind
    assert _named(docs, "ConfigMap") == {k: f"{v}-config" for k, v in expected.items()}
    namespaces = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    assert namespaces == {coordinator_namespace(cfg)} | {
        participant_namespace(cfg, td) for td in domains
    }
    secrets = {
        source["secret"]["name"]
        for doc in docs
        if doc["kind"] in ("Deployment", "StatefulSet")
        for volume in doc["spec"]["template"]["spec"]["volumes"]
        if volume["name"] == "tls"
        for source in volume["projected"]["sources"]
    }
    identities = ["coordinator", *cfg.participant_ids]
    assert secrets == {tls_secret_name(cfg, identity) for identity in identities}
    for name in expected.values():
        assert len(name) <= MAX_OBJECT_NAME


def test_safe_name_cuts_long_names_and_keeps_them_distinct() -> None:
    full = "r" * 39 + "-x--" + "y" * 27
    name = safe_name(full)
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    # Go's trimSuffix drops exactly one trailing hyphen of the 43-character prefix.
    assert name == "r" * 39 + "-x--" + digest
    assert len(safe_name("a" * 71)) == KEPT_PREFIX + 9
    assert safe_name("a" * MAX_OBJECT_NAME) == "a" * MAX_OBJECT_NAME
    assert safe_name("a" * 71) != safe_name("a" * 70)


def test_values_without_names_say_how_to_render_them() -> None:
    from lensemble.errors import UsageError

    require("helm")
    values = render_helm_values(config_of("helm-staging"))
    values["names"]["participants"] = {}
    with pytest.raises(UsageError) as raised:
        render_chart(values)
    message = str(raised.value)
    assert "names.participants has no 'site-" in message
    assert "lensemble render helm-values --config FILE" in message
