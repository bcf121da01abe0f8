"""Security and residency policy, asserted on every rendered output (Helm and Kustomize).

The rules live once in ``lensemble.render.k8s_policy``; here they run on every case, and each rule
is shown to fire on a manifest that breaks it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from lensemble.render.k8s_policy import RULES, violations, workloads
from tests.k8s.renders import CASES, config_of, render

Docs = list[dict[str, Any]]


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rendered_output_passes_the_policy(case: str) -> None:
    docs = render(case)
    assert docs, f"{case} rendered nothing"
    assert violations(docs, config_of(case)) == []


def _first(docs: Docs, kind: str, component: str | None = None) -> dict[str, Any]:
    for doc in docs:
        labels = (doc.get("metadata") or {}).get("labels") or {}
        if doc["kind"] == kind and component in (None, labels.get("app.kubernetes.io/component")):
            return doc
    raise AssertionError(f"no {kind} ({component})")


def _container(doc: dict[str, Any]) -> dict[str, Any]:
    return next(workloads([doc]))[2]["containers"][0]


def _writable_root(docs: Docs) -> None:
    _container(_first(docs, "Deployment"))["securityContext"]["readOnlyRootFilesystem"] = False


def _root_user(docs: Docs) -> None:
    sts = _first(docs, "StatefulSet")
    sts["spec"]["template"]["spec"]["securityContext"]["runAsUser"] = 0


def _no_limits(docs: Docs) -> None:
    _container(_first(docs, "StatefulSet"))["resources"] = {"requests": {"cpu": "1"}}


def _host_path(docs: Docs) -> None:
    spec = _first(docs, "StatefulSet")["spec"]["template"]["spec"]
    spec["volumes"].append({"name": "host", "hostPath": {"path": "/"}})


def _host_network(docs: Docs) -> None:
    _first(docs, "Deployment")["spec"]["template"]["spec"]["hostNetwork"] = True


def _token(docs: Docs) -> None:
    _first(docs, "ServiceAccount")["automountServiceAccountToken"] = True


def _no_default_deny(docs: Docs) -> None:
    docs[:] = [d for d in docs if not d["metadata"]["name"].endswith("-default-deny")]


def _open_egress(docs: Docs) -> None:
    policy = next(d for d in docs if d["metadata"]["name"].endswith("-allow-coordinator"))
    policy["spec"]["egress"][0]["to"].append({"ipBlock": {"cidr": "0.0.0.0/0"}})


def _coordinator_mounts_participant_data(docs: Docs) -> None:
    docs.append(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": "data-lensemble-local-alpine-labs-0",
                "namespace": "lensemble",
                "labels": {"lensemble.dev/trust-domain": "alpine-labs"},
            },
            "spec": {},
        }
    )
    spec = _first(docs, "Deployment")["spec"]["template"]["spec"]
    spec["volumes"].append(
        {"name": "x", "persistentVolumeClaim": {"claimName": "data-lensemble-local-alpine-labs-0"}}
    )


def _foreign_volume(docs: Docs) -> None:
    sts = _first(docs, "StatefulSet")
    sts["spec"]["volumeClaimTemplates"][0]["metadata"]["labels"]["lensemble.dev/trust-domain"] = (
        "someone-else"
    )


def _key_in_configmap(docs: Docs) -> None:
    _first(docs, "ConfigMap")["data"]["tls.key"] = "-----BEGIN PRIVATE KEY-----\n..."


def _unrestricted_namespace(docs: Docs) -> None:
    del _first(docs, "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]


def _latest(docs: Docs) -> None:
    _container(_first(docs, "Deployment"))["image"] = "ghcr.io/lensemble/lensemble:latest"


BREAKS: dict[str, tuple[str, Callable[[Docs], None]]] = {
    "writable-root": ("hardened-containers", _writable_root),
    "root-user": ("hardened-containers", _root_user),
    "no-limits": ("hardened-containers", _no_limits),
    "host-path": ("no-host-access", _host_path),
    "host-network": ("no-host-access", _host_network),
    "token": ("no-api-token", _token),
    "no-default-deny": ("default-deny-networkpolicy", _no_default_deny),
    "open-egress": ("no-open-networkpolicy-rule", _open_egress),
    "coordinator-mounts-data": ("participant-data-isolation", _coordinator_mounts_participant_data),
    "foreign-volume": ("participant-data-isolation", _foreign_volume),
    "key-in-configmap": ("no-secret-material", _key_in_configmap),
    "unrestricted-namespace": ("restricted-namespaces", _unrestricted_namespace),
}


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_each_rule_catches_a_manifest_that_breaks_it(name: str) -> None:
    rule, breaker = BREAKS[name]
    docs = render("helm-local")
    breaker(docs)
    found = violations(docs, config_of("helm-local"))
    assert found, f"{name} went unnoticed"
    assert {line.split(":", 1)[0] for line in found} == {rule}


def test_latest_is_refused_outside_local_only() -> None:
    docs = render("helm-staging")
    _latest(docs)
    assert [v.split(":", 1)[0] for v in violations(docs, config_of("helm-staging"))] == [
        "pinned-images"
    ]
    local = render("helm-local")
    _latest(local)
    assert violations(local, config_of("helm-local")) == []


def test_every_rule_is_exercised() -> None:
    assert {rule for rule, _ in BREAKS.values()} | {"pinned-images"} == set(RULES)
