"""Where this process sits in its participant's rank group: node rank, rendezvous host, rank.

Node rank 0 is the node that talks to the coordinator and hosts the rendezvous; its local rank 0
is rank 0 of the group. The node rank and node 0's host come from the environment
(``LENSEMBLE_NODE_RANK``, ``LENSEMBLE_RENDEZVOUS_HOST``), which the renderers set per pod or
container.
"""

from __future__ import annotations

import os

from lensemble.config.schema import NODE_RANK_ENV, RENDEZVOUS_HOST_ENV, RankLayout
from lensemble.errors import UsageError


def node_rank(layout: RankLayout) -> int:
    """This node's rank in the participant's group, from ``LENSEMBLE_NODE_RANK`` (default 0).

    Raises:
        UsageError: The variable is not an integer in ``[0, nodes)``.
    """
    text = os.environ.get(NODE_RANK_ENV, "0").strip() or "0"
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < layout.nodes:
        raise UsageError(
            f"{NODE_RANK_ENV}={text!r} is not a node rank of a {layout.nodes}-node layout;",
            remediation=f"set it to an integer from 0 to {layout.nodes - 1}.",
        )
    return value


def rendezvous_host() -> str:
    """Node rank 0's host, from ``LENSEMBLE_RENDEZVOUS_HOST`` (default ``127.0.0.1``)."""
    return os.environ.get(RENDEZVOUS_HOST_ENV, "127.0.0.1").strip() or "127.0.0.1"


def group_rank(node: int, local_rank: int, layout: RankLayout) -> int:
    """A rank's place in its group: ``node x processes_per_node + local_rank``.

    Args:
        node: The node rank (``LENSEMBLE_NODE_RANK``, 0 on the node that talks to the
            coordinator).
        local_rank: The rank on its node (torch's ``LOCAL_RANK``).
        layout: The participant's rank layout.

    Raises:
        ValueError: ``local_rank`` is outside ``[0, processes_per_node)``.
    """
    if not 0 <= local_rank < layout.processes_per_node:
        raise ValueError(
            f"LOCAL_RANK={local_rank} is not a local rank of {layout.processes_per_node} "
            "processes per node"
        )
    return node * layout.processes_per_node + local_rank
