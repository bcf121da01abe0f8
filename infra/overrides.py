"""Chart knobs a stack owns, layered over the values of ``lensemble render helm-values``.

The rendered values say what the config says; these say what only the stack knows: that Pulumi
made the namespaces, where the participant's image copy lives, and who may reach a coordinator
in another cluster. Every key here is a documented knob of ``charts/lensemble/values.yaml``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Annotations of the coordinator's Service when participants in other clusters dial it: an
#: internet-facing Network Load Balancer (the in-tree AWS service controller) that accepts
#: only the listed source ranges.
NLB_TYPE = "service.beta.kubernetes.io/aws-load-balancer-type"
SOURCE_RANGES = "service.beta.kubernetes.io/load-balancer-source-ranges"


def _peers(cidrs: Sequence[str]) -> list[dict[str, Any]]:
    return [{"ipBlock": {"cidr": cidr}} for cidr in cidrs]


def stack_overrides(
    *,
    namespaces_by_pulumi: bool,
    image_repository: str | None = None,
    coordinator_ingress_cidrs: Sequence[str] = (),
    coordinator_cidrs: Sequence[str] = (),
    run_record_kms_key_id: str | None = None,
) -> dict[str, Any]:
    """The values layered over the rendered ones.

    Args:
        namespaces_by_pulumi: Pulumi made the namespaces (``namespaces.create: false``).
        image_repository: Repository of the participant's own region (``image.repository``).
        coordinator_ingress_cidrs: Participants' egress addresses: the coordinator's Service
            becomes an internet-facing load balancer open to them only, and its NetworkPolicy
            admits them on gRPC and the model download (``coordinator.service``,
            ``networkPolicy.participantPeers``).
        coordinator_cidrs: The coordinator's addresses, the participants' only egress besides
            DNS (``networkPolicy.coordinatorPeers``), on the same two ports.
        run_record_kms_key_id: The run's KMS MAC key; the coordinator signs its run record with
            it (``coordinator.runRecord.kmsKeyId``).

    Returns:
        A values mapping (empty when the stack owns nothing).
    """
    out: dict[str, Any] = {}
    if namespaces_by_pulumi:
        out["namespaces"] = {"create": False}
    if image_repository is not None:
        out["image"] = {"repository": image_repository}
    policy: dict[str, Any] = {}
    if coordinator_ingress_cidrs:
        out["coordinator"] = {
            "service": {
                "type": "LoadBalancer",
                "annotations": {
                    NLB_TYPE: "nlb",
                    SOURCE_RANGES: ",".join(coordinator_ingress_cidrs),
                },
            }
        }
        policy["participantPeers"] = _peers(coordinator_ingress_cidrs)
    if run_record_kms_key_id:
        out.setdefault("coordinator", {})["runRecord"] = {"kmsKeyId": run_record_kms_key_id}
    if coordinator_cidrs:
        policy["coordinatorPeers"] = _peers(coordinator_cidrs)
    if policy:
        out["networkPolicy"] = policy
    return out
