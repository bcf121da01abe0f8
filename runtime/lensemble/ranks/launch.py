"""Start a participant's rank group with torch's elastic launcher (the library behind torchrun).

The participant command (``lensemble participant`` or the in-process simulation) calls
:func:`launch_round` once per round; torch's elastic agent spawns ``processes_per_node`` ranks
on this node, meets the other nodes at the c10d rendezvous
(``LENSEMBLE_RENDEZVOUS_HOST:rendezvous_port``; node rank ``LENSEMBLE_NODE_RANK`` 0 hosts it),
restarts the group within ``max_restarts`` when a rank dies, and returns when every rank has.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
from pathlib import Path
from typing import Any

from lensemble.config.schema import RankLayout
from lensemble.errors import RankFailure, UsageError

NODE_RANK_ENV = "LENSEMBLE_NODE_RANK"
RENDEZVOUS_HOST_ENV = "LENSEMBLE_RENDEZVOUS_HOST"
_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


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


def launch_round(
    layout: RankLayout, folder: Path, run_id: str, rendezvous_timeout_s: int = 900
) -> None:
    """Run :func:`lensemble.ranks.worker.rank_main` on this node's ranks for one round.

    Args:
        layout: The participant's rank layout.
        folder: The round folder (:mod:`lensemble.ranks.exchange`).
        run_id: Rendezvous id, the same on every node of the group.
        rendezvous_timeout_s: How long to wait for every node at the rendezvous (seconds).

    Raises:
        RankFailure: The group failed more often than ``layout.max_restarts`` within the
            round (torch's ``ChildFailedError``, summarised).
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from lensemble.ranks.worker import rank_main

    host = os.environ.get(RENDEZVOUS_HOST_ENV, "127.0.0.1").strip() or "127.0.0.1"
    config = LaunchConfig(
        min_nodes=layout.nodes,
        max_nodes=layout.nodes,
        nproc_per_node=layout.processes_per_node,
        run_id=run_id,
        rdzv_backend="c10d",
        rdzv_endpoint=f"{host}:{layout.rendezvous_port}",
        rdzv_configs={"is_host": node_rank(layout) == 0},
        rdzv_timeout=rendezvous_timeout_s,
        max_restarts=layout.max_restarts,
        monitor_interval=0.1,
        start_method="spawn",
    )
    # The agent installs its own handlers for these signals in the main thread and leaves them
    # there: put ours back, and hand a signal that arrived during the launch to them.
    saved = {sig: signal.getsignal(sig) for sig in _HANDLED}
    try:
        elastic_launch(config, rank_main)(str(folder))
    except SignalException as exc:
        _restore(saved)
        signal.raise_signal(exc.sigval)
        raise  # the previous handler ignored it: the round is still lost
    except ChildFailedError as exc:
        raise RankFailure(
            f"the rank group failed {layout.max_restarts + 1} times in one round "
            f"({len(exc.failures)} rank(s) in the last try);",
            remediation="see the ranks' errors above; raise max_restarts of the rank layout "
            "if the failures are transient.",
        ) from None
    finally:
        _restore(saved)
        # The agent's rendezvous store (a server thread in this process) can outlive a restarted
        # group in a reference cycle, keep the port and answer the next launch as "closed".
        gc.collect()


def _restore(saved: dict[signal.Signals, Any]) -> None:
    if threading.current_thread() is threading.main_thread():
        for sig, handler in saved.items():
            signal.signal(sig, handler)
