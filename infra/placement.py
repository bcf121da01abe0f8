"""Where a config's pieces go: the region of each trust domain and the node group of each pool.

These are decisions read from the config (``federation.participants[].region``,
``deployment.trust_domains``, ``deployment.confidential_compute``), kept apart from the
resources so they read as the rules they are.
"""

from __future__ import annotations

from infra.cluster import NodePool, Taint, TaintEffect
from infra.sizing import NodeGroupSize, node_group_size
from lensemble.config import LensembleConfig
from lensemble.errors import ConfigError, ConfigProblem
from lensemble.render.names import CONFIDENTIAL_LABEL, POOL_LABEL, TEE_LABEL, TRUST_DOMAIN_LABEL

#: Kubernetes taint effects in the EKS API's spelling; a toleration without an effect
#: tolerates every effect, so its taint uses NoSchedule.
EKS_TAINT_EFFECT: dict[str, TaintEffect] = {
    "NoSchedule": "NO_SCHEDULE",
    "NoExecute": "NO_EXECUTE",
    "PreferNoSchedule": "PREFER_NO_SCHEDULE",
}
#: Nodes of the system node group (CoreDNS, Pod Identity agent, and the coordinator when it
#: does not need confidential compute).
SYSTEM_NODES = 2


def trust_domain_region(config: LensembleConfig, trust_domain: str) -> str:
    """The region a trust domain's data is pinned to.

    That is its participants' ``region``, else ``deployment.cloud.region``.

    Raises:
        ConfigError: The trust domain's participants name different regions.
    """
    regions = {
        p.region
        for p in config.federation.participants
        if p.trust_domain == trust_domain and p.region is not None
    }
    if len(regions) > 1:
        raise ConfigError(
            [
                ConfigProblem(
                    "federation.participants",
                    f"trust domain '{trust_domain}' spans regions {', '.join(sorted(regions))}; "
                    "give every participant of one trust domain the same region.",
                )
            ]
        )
    return regions.pop() if regions else config.deployment.cloud.region


def participant_pool(config: LensembleConfig, trust_domain: str, size: NodeGroupSize) -> NodePool:
    """The node group of one trust domain, of ``size`` (:func:`infra.sizing.node_group_size`).

    Labelled and tainted as ``deployment.trust_domains`` says, and labelled with
    ``lensemble.dev/trust-domain`` in any case.
    """
    placement = config.deployment.trust_domains.get(trust_domain)
    labels = {POOL_LABEL: "participant", TRUST_DOMAIN_LABEL: trust_domain}
    taints: list[Taint] = []
    if placement is not None:
        labels.update(placement.node_selector)
        for toleration in placement.tolerations:
            effect = EKS_TAINT_EFFECT[toleration.effect or "NoSchedule"]
            value = toleration.value if toleration.operator == "Equal" else None
            taints.append(Taint(key=toleration.key, value=value, effect=effect))
    return NodePool(
        name=trust_domain,
        instance_type=size.instance_type,
        size=size.nodes,
        labels=labels,
        taints=tuple(taints),
        gpu=size.gpu,
    )


def node_pools(
    config: LensembleConfig,
    trust_domains: list[str],
    *,
    with_coordinator: bool,
    system_instance_type: str,
    coordinator_instance_type: str,
    participant_instance_type: str | None,
    participant_nodes: int | None,
    stack: str = "",
) -> tuple[NodePool, ...]:
    """Every node group of a cluster.

    A system group; a confidential (AMD SEV-SNP) coordinator group when the cluster runs the
    coordinator and ``deployment.confidential_compute`` is set; one group per trust domain,
    sized from the config's rank layouts unless the stack sets the instance type or node count
    (:func:`infra.sizing.node_group_size`).

    Raises:
        ConfigError: A trust domain's pods fit no instance type, or a stack setting is too
            small for them.
    """
    pools = [NodePool("system", system_instance_type, SYSTEM_NODES, {POOL_LABEL: "system"})]
    if with_coordinator and config.deployment.confidential_compute:
        # The chart requires this label and tolerates this taint for the coordinator; the
        # taint keeps every other pod off the confidential nodes.
        pools.append(
            NodePool(
                "coordinator",
                coordinator_instance_type,
                1,
                {POOL_LABEL: "coordinator", CONFIDENTIAL_LABEL: "true", TEE_LABEL: "amd-sev-snp"},
                taints=(Taint(key=CONFIDENTIAL_LABEL, value="true", effect="NO_SCHEDULE"),),
                confidential=True,
            )
        )
    pools += [
        participant_pool(
            config,
            td,
            node_group_size(
                config,
                td,
                stack=stack,
                instance_type=participant_instance_type,
                nodes=participant_nodes,
            ),
        )
        for td in trust_domains
    ]
    return tuple(pools)
