"""Every rendered document is valid against the Kubernetes OpenAPI schemas (strict).

Checked with kubernetes-validate for Kubernetes 1.33 and for the newest version it ships, on
every case (Helm and Kustomize). Custom resources (cert-manager, Prometheus Operator, Volcano) have no
schema there; they are listed explicitly so that nothing else can slip through unchecked.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from tests.k8s.renders import CASES, render
from tests.support.tools import require

#: Custom resources the chart may render; kubernetes-validate has no schema for them.
CUSTOM_KINDS = {
    ("cert-manager.io/v1", "Certificate"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("scheduling.volcano.sh/v1beta1", "PodGroup"),
}


def _versions() -> list[str]:
    require("kubernetes-validate")
    import kubernetes_validate.utils as kv

    return ["1.33", ".".join(kv.latest_version().split(".")[:2])]


@functools.cache
def _validate(doc_json: str, version: str) -> str | None:
    """None when valid, else the error (cached: the same object appears in many cases)."""
    import kubernetes_validate

    doc = json.loads(doc_json)
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(p) for p in exc.path)
        return f"{doc['kind']}/{doc['metadata']['name']}: {where}: {exc.message}"
    return None


def _check(docs: list[dict[str, Any]]) -> list[str]:
    errors = []
    for version in _versions():
        for doc in docs:
            if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
                continue
            error = _validate(json.dumps(doc, sort_keys=True), version)
            if error:
                errors.append(f"{version}: {error}")
    return errors


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_document_is_valid_kubernetes(case: str) -> None:
    assert _check(render(case)) == []


def test_the_newest_version_is_newer_than_1_33() -> None:
    assert float(_versions()[1].split(".", 1)[1]) > 33


def _container_of(spec: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = spec["template"]["spec"]["containers"][0]
    return container


@pytest.mark.parametrize(
    ("field", "breaker"),
    [
        ("readOnly", lambda s: _container_of(s).update(readOnly=True)),
        ("replicas", lambda s: s.update(replicas="four")),
        ("port", lambda s: _container_of(s)["livenessProbe"]["grpc"].update(port="health")),
    ],
)
def test_invalid_documents_are_caught(field: str, breaker: Any) -> None:
    docs = render("helm-local")
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    breaker(sts["spec"])
    errors = _check([sts])
    assert len(errors) == 2  # both Kubernetes versions
    assert all(field in e for e in errors)


def test_custom_resources_are_only_the_known_ones() -> None:
    kinds = {
        (d["apiVersion"], d["kind"])
        for case in CASES
        for d in render(case)
        if not d["apiVersion"].startswith(("v1", "apps/", "policy/", "networking.k8s.io/"))
    }
    assert kinds == CUSTOM_KINDS
