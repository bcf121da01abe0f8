"""Security and residency policy over rendered Kubernetes manifests, written once.

Every rendered output (Helm, every overlay, every install mode) must pass :func:`violations`;
``lensemble render k8s`` refuses to write manifests that do not (:func:`enforce`), and the tests
run it on everything they render. Each rule returns one sentence per offending object.

Rules: hardened containers (non-root, read-only root filesystem, no privilege escalation, all
capabilities dropped, seccomp RuntimeDefault, resources set); no privileged, hostPath, host
network/PID/IPC or host ports; no API token mounted; a default-deny NetworkPolicy in every
namespace with lensemble pods; no NetworkPolicy open to every address, alone or together with
the other policies selecting the same pod (no rule without peers, no ipBlocks that together
cover all of IPv4 or IPv6, no namespaceSelector that names no namespace:
:mod:`lensemble.render.policy_reach`); each
participant data volume mounted only by its own trust domain's pods and never by the
coordinator; no Secret objects and no key material in ConfigMaps; Pod Security Admission
``restricted`` on every namespace created; no ``latest`` image outside local.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from lensemble.config.schema import UNPINNED_TAG, LensembleConfig, unpinned_tag_refused
from lensemble.errors import IntegrityError
from lensemble.render.names import COMPONENT_LABEL, TRUST_DOMAIN_LABEL
from lensemble.render.policy_reach import (
    covers_every_address,
    peer_problems,
    rule_cidrs,
    selects,
)

Manifest = dict[str, Any]

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "Pod")
#: Text that marks key or certificate material.
_SECRET_MARKERS = ("-----BEGIN", "PRIVATE KEY")


def _name(doc: Manifest) -> str:
    meta = doc.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{doc.get('kind')}/{meta.get('name')}" + (f" in {ns}" if ns else "")


def _namespace(doc: Manifest) -> str:
    return str((doc.get("metadata") or {}).get("namespace", ""))


def pod_template(doc: Manifest) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The pod metadata and spec of a workload, or None for other kinds."""
    kind = doc.get("kind")
    if kind not in WORKLOAD_KINDS:
        return None
    if kind == "Pod":
        return doc.get("metadata") or {}, doc.get("spec") or {}
    spec = doc.get("spec") or {}
    if kind == "CronJob":
        spec = (spec.get("jobTemplate") or {}).get("spec") or {}
    template = spec.get("template") or {}
    return template.get("metadata") or {}, template.get("spec") or {}


def workloads(
    docs: Iterable[Manifest],
) -> Iterator[tuple[Manifest, dict[str, Any], dict[str, Any]]]:
    """Every workload with its pod metadata and pod spec."""
    for doc in docs:
        found = pod_template(doc)
        if found is not None:
            yield doc, found[0], found[1]


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


Context = dict[str, Any]

#: What a hardened container's security context (or its pod's) must say: (test, the problem).
_HARDENING: tuple[tuple[Callable[[Context, Context], bool], str], ...] = (
    (
        lambda ctx, pod: bool(ctx.get("runAsNonRoot") or pod.get("runAsNonRoot")),
        "may run as root (set runAsNonRoot: true).",
    ),
    (lambda ctx, pod: 0 not in (ctx.get("runAsUser"), pod.get("runAsUser")), "runs as UID 0."),
    (lambda ctx, _: ctx.get("readOnlyRootFilesystem") is True, "has a writable root filesystem."),
    (lambda ctx, _: ctx.get("allowPrivilegeEscalation") is False, "allows privilege escalation."),
    (lambda ctx, _: not ctx.get("privileged"), "is privileged."),
    (
        lambda ctx, _: "ALL" in ((ctx.get("capabilities") or {}).get("drop") or []),
        "does not drop ALL capabilities.",
    ),
    (lambda ctx, _: not (ctx.get("capabilities") or {}).get("add"), "adds capabilities."),
    (
        lambda ctx, pod: (
            (ctx.get("seccompProfile") or pod.get("seccompProfile") or {}).get("type")
            in ("RuntimeDefault", "Localhost")
        ),
        "has no RuntimeDefault seccomp profile.",
    ),
)


def _container_problems(container: dict[str, Any], pod_ctx: Context) -> Iterator[str]:
    """What is not hardened about one container (security context, resources, host ports)."""
    ctx = container.get("securityContext") or {}
    for holds, problem in _HARDENING:
        if not holds(ctx, pod_ctx):
            yield problem
    resources = container.get("resources") or {}
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    if not ({"cpu", "memory"} <= set(requests) and "memory" in limits):
        yield "lacks cpu/memory requests or a memory limit."
    if any(p.get("hostPort") for p in container.get("ports") or []):
        yield "uses a hostPort."


def _hardened(docs: Sequence[Manifest], config: LensembleConfig) -> Iterator[str]:
    for doc, _, spec in workloads(docs):
        pod_ctx = spec.get("securityContext") or {}
        for c in _containers(spec):
            where = f"{_name(doc)} container {c.get('name')}"
            for problem in _container_problems(c, pod_ctx):
                yield f"{where} {problem}"


def _no_host_access(docs: Sequence[Manifest], config: LensembleConfig) -> Iterator[str]:
    for doc, _, spec in workloads(docs):
        for field in ("hostNetwork", "hostPID", "hostIPC"):
            if spec.get(field):
                yield f"{_name(doc)} sets {field}."
        for volume in spec.get("volumes") or []:
            if "hostPath" in volume:
                yield f"{_name(doc)} mounts hostPath volume {volume.get('name')}."


def _no_api_token(docs: Sequence[Manifest], config: LensembleConfig) -> Iterator[str]:
    for doc in docs:
        if doc.get("kind") == "ServiceAccount" and doc.get("automountServiceAccountToken", True):
            yield f"{_name(doc)} automounts its API token."
    for doc, _, spec in workloads(docs):
        if spec.get("automountServiceAccountToken", True):
            yield f"{_name(doc)} mounts a service account token."


def _is_default_deny(doc: Manifest) -> bool:
    spec = doc.get("spec") or {}
    return (
        doc.get("kind") == "NetworkPolicy"
        and spec.get("podSelector") in ({}, None)
        and set(spec.get("policyTypes") or []) >= {"Ingress", "Egress"}
        and not spec.get("ingress")
        and not spec.get("egress")
    )


def _default_deny(docs: Sequence[Manifest], config: LensembleConfig) -> Iterator[str]:
    denied = {_namespace(d) for d in docs if _is_default_deny(d)}
    namespaces = {_namespace(doc) for doc, _, _ in workloads(docs)}
    for ns in sorted(namespaces - denied):
        yield f"namespace {ns} runs lensemble pods but has no default-deny NetworkPolicy."


def _direction_problems(
    name: str, direction: str, rules: list[dict[str, Any]], peers_key: str
) -> Iterator[str]:
    """What opens one policy's ingress or egress rules to every address or namespace."""
    for rule in rules:
        peers = rule.get(peers_key)
        if not peers:
            yield f"{name} has an {direction} rule open to every address."
            continue
        for peer in peers:
            yield from peer_problems(name, direction, peer)
    cidrs = rule_cidrs(rules, peers_key)
    if covers_every_address(cidrs):
        yield (
            f"{name} allows {direction} with ipBlocks that together cover every "
            f"address ({', '.join(cidrs)})."
        )


_DIRECTIONS = (("egress", "to"), ("ingress", "from"))


def _no_open_rules(docs: Sequence[Manifest], config: LensembleConfig) -> Iterator[str]:
    policies = [doc for doc in docs if doc.get("kind") == "NetworkPolicy"]
    for doc in policies:
        spec = doc.get("spec") or {}
        for direction, peers_key in _DIRECTIONS:
            yield from _direction_problems(
                _name(doc), direction, spec.get(direction) or [], peers_key
            )
    yield from _open_together(docs, policies)


def _open_together(docs: Sequence[Manifest], policies: list[Manifest]) -> Iterator[str]:
    """Pods whose policies, each narrow alone, together admit every address.

    NetworkPolicies are additive: a pod may reach (or be reached from) the union of the peers
    of every policy in its namespace whose podSelector selects it. A policy open on its own is
    reported by :func:`_direction_problems`, so only unions of two or more are reported here.
    """
    for doc, meta, _ in workloads(docs):
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        selecting = [
            p
            for p in policies
            if _namespace(p) == _namespace(doc)
            and selects((p.get("spec") or {}).get("podSelector"), labels)
        ]
        for direction, peers_key in _DIRECTIONS:
            problem = _union_problem(selecting, direction, peers_key)
            if problem:
                yield f"{_name(doc)} is open to every address for {direction}: {problem}"


def _union_problem(selecting: list[Manifest], direction: str, peers_key: str) -> str | None:
    """Why the ipBlocks of two or more of ``selecting`` together cover every address, if so."""
    by_policy = {
        _name(p): rule_cidrs((p.get("spec") or {}).get(direction) or [], peers_key)
        for p in selecting
    }
    contributing = sorted(name for name, cidrs in by_policy.items() if cidrs)
    cidrs = [cidr for name in contributing for cidr in by_policy[name]]
    if len(contributing) < 2 or not covers_every_address(cidrs):
        return None
    return (
        f"the ipBlocks of {', '.join(contributing)}, which all select it, together cover every "
        f"address ({', '.join(cidrs)})."
    )


def _claims(spec: dict[str, Any]) -> list[str]:
    return [
        v["persistentVolumeClaim"].get("claimName", "")
        for v in spec.get("volumes") or []
        if "persistentVolumeClaim" in v
    ]


def _claim_owners(docs: Sequence[Manifest]) -> dict[tuple[str, str], str | None]:
    """(namespace, name) of every PersistentVolumeClaim -> the trust domain it belongs to."""
    owners: dict[tuple[str, str], str | None] = {}
    for doc in docs:
        if doc.get("kind") == "PersistentVolumeClaim":
            meta = doc.get("metadata") or {}
            labels = meta.get("labels") or {}
            owners[(meta.get("namespace", ""), meta.get("name", ""))] = labels.get(
                TRUST_DOMAIN_LABEL
            )
    return owners


def _foreign_claims(doc: Manifest, role: str | None, own: str | None) -> Iterator[str]:
    """VolumeClaimTemplates of a workload that claim another trust domain's data."""
    for template in (doc.get("spec") or {}).get("volumeClaimTemplates") or []:
        owner = ((template.get("metadata") or {}).get("labels") or {}).get(TRUST_DOMAIN_LABEL)
        if role == "coordinator" and owner:
            yield f"{_name(doc)} (coordinator) claims participant data of {owner}."
        elif role == "participant" and owner != own:
            yield f"{_name(doc)} of trust domain {own} claims a volume of {owner}."


def _data_volumes(docs: Sequence[Manifest], config: LensembleConfig) -> Iterator[str]:
    claim_owner = _claim_owners(docs)
    for doc, meta, spec in workloads(docs):
        labels = meta.get("labels") or {}
        own, role = labels.get(TRUST_DOMAIN_LABEL), labels.get(COMPONENT_LABEL)
        ns = (doc.get("metadata") or {}).get("namespace", "")
        yield from _foreign_claims(doc, role, own)
        for claim in _claims(spec):
            owner = claim_owner.get((ns, claim))
            if role == "coordinator" and owner:
                yield f"{_name(doc)} (coordinator) mounts participant data {claim} of {owner}."
            elif role != "coordinator" and owner != own:
                yield f"{_name(doc)} of trust domain {own} mounts {claim} of {owner}."


def _no_secret_material(docs: Sequence[Manifest], config: LensembleConfig) -> Iterator[str]:
    for doc in docs:
        if doc.get("kind") == "Secret":
            yield f"{_name(doc)}: the chart never writes Secrets (TLS comes from existing ones)."
        if doc.get("kind") != "ConfigMap":
            continue
        data = {**(doc.get("data") or {}), **(doc.get("binaryData") or {})}
        for key, value in data.items():
            if key.endswith((".key", ".pem", ".crt")) or any(
                m in str(value) for m in _SECRET_MARKERS
            ):
                yield f"{_name(doc)} holds key or certificate material in {key}."


def _restricted_namespaces(docs: Sequence[Manifest], config: LensembleConfig) -> Iterator[str]:
    for doc in docs:
        if doc.get("kind") != "Namespace":
            continue
        labels = (doc.get("metadata") or {}).get("labels") or {}
        if labels.get("pod-security.kubernetes.io/enforce") != "restricted":
            yield f"{_name(doc)} does not enforce Pod Security 'restricted'."


def _pinned_images(docs: Sequence[Manifest], config: LensembleConfig) -> Iterator[str]:
    env = config.deployment.environment
    for doc, _, spec in workloads(docs):
        for c in _containers(spec):
            image = str(c.get("image", ""))
            if "@sha256:" in image:
                continue  # a digest pins the image whatever the tag says
            # A reference without a tag means the registry's default tag.
            tag = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else UNPINNED_TAG
            if unpinned_tag_refused(env, tag):
                yield f"{_name(doc)} runs {image or 'an image'} with the '{tag}' tag."


Rule = Callable[[Sequence[Manifest], LensembleConfig], Iterator[str]]

#: Every rule, by name.
RULES: dict[str, Rule] = {
    "hardened-containers": _hardened,
    "no-host-access": _no_host_access,
    "no-api-token": _no_api_token,
    "default-deny-networkpolicy": _default_deny,
    "no-open-networkpolicy-rule": _no_open_rules,
    "participant-data-isolation": _data_volumes,
    "no-secret-material": _no_secret_material,
    "restricted-namespaces": _restricted_namespaces,
    "pinned-images": _pinned_images,
}


def violations(docs: Sequence[Manifest], config: LensembleConfig) -> list[str]:
    """Every policy violation in ``docs``, as ``rule: sentence`` lines (empty when clean).

    Args:
        docs: Rendered Kubernetes objects (any mix of kinds).
        config: The config they were rendered from (its environment decides the image rule).
    """
    return [f"{name}: {line}" for name, rule in RULES.items() for line in rule(docs, config)]


def enforce(docs: Sequence[Manifest], config: LensembleConfig, *, source: str) -> None:
    """Fail closed when rendered manifests break a policy.

    Raises:
        IntegrityError: At least one violation; the message lists them all and names
            ``source`` (the overlay or chart that produced them).
    """
    found = violations(docs, config)
    if found:
        raise IntegrityError(
            f"{source} renders manifests that break the Kubernetes policy: " + " ".join(found),
            remediation="Fix the overlay or values; see runtime/lensemble/render/k8s_policy.py.",
        )
