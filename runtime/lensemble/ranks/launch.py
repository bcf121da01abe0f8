"""Start a participant's rank group with torch's elastic launcher (the library behind torchrun).

The participant command (``lensemble participant`` or the in-process simulation) calls
:func:`launch_round` once per round; torch's elastic agent spawns ``processes_per_node`` ranks
on this node, meets the other nodes at the c10d rendezvous
(``LENSEMBLE_RENDEZVOUS_HOST:rendezvous_port``; node rank ``LENSEMBLE_NODE_RANK`` 0 hosts it),
restarts the group within ``max_restarts`` when a rank dies, and returns when every rank has.
A one-node group has no other node to meet: its rendezvous takes a free loopback port for each
launch (as ``torchrun --standalone`` does), so several multi-rank participants on one host
(the local network launcher, processes started by hand) never compete for ``rendezvous_port``,
which only a multi-node group uses.

Every launch has its own rendezvous id. On one node it is made up on the spot; on several,
node 0 names it on its :class:`LaunchBoard` and the other nodes read it there. A rendezvous id
shared by consecutive launches is not safe: the c10d store on the rendezvous port is
multi-tenant within a process, so a launch on node 0 can find the previous launch's store still
alive (it goes when garbage collection gets to it) with that id's rendezvous marked closed, and
fail with ``RendezvousClosedError``.

A rank that dies without a Python error of its own (killed by a signal, as the ``rank_kill``
fault or the OOM killer do, or exiting with a code) is a failure Lensemble handles: the round is
lost as ``rank_failure`` and the next round starts a new group. During a launch,
:class:`RankDeaths` holds back torch's own report of it (an ERROR traceback of torch's
``ProcessExitedException`` in the agent, and the warnings as it stops the other ranks) and
:func:`launch_round` returns one phrase per dead rank for Lensemble's own one-line message. A
rank that raised keeps its traceback (``ProcessRaisedException``), as does everything else.
"""

from __future__ import annotations

import gc
import logging
import math
import re
import signal
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lensemble.config.schema import RENDEZVOUS_HOST_ENV, RankLayout
from lensemble.errors import RankFailure
from lensemble.ranks.placement import node_rank, rendezvous_host

if TYPE_CHECKING:
    from torch._C._distributed_c10d import TCPStore

_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)

#: How the elastic agent starts a round's ranks. ``forkserver``: from a server process that
#: imported torch and the rank code once (:data:`PRELOAD`), so a rank starts in a fork instead
#: of a fresh interpreter importing torch every round, which ``spawn`` did (seconds per rank and
#: round, tens of seconds under load: docs/performance.md#rank-groups-in-process). The server
#: is a clean interpreter, never a fork of this process and its threads. It keeps the
#: environment of the process at its first launch; the variables the ranks read
#: (``LENSEMBLE_NODE_RANK``, ``LENSEMBLE_RENDEZVOUS_HOST``) are set before a process starts.
START_METHOD = "forkserver"

#: Modules the fork server imports once, before it forks any rank (a missing one is skipped).
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint.state_dict",
    "torch.distributed.elastic.multiprocessing.api",
    # What a rank's first FSDP2 wrap and optimizer step import lazily (about 280 modules, 2 to
    # 5 s a rank under load when each fork imported them again), and the environments the
    # participant's data cache names.
    "torch._dynamo",
    "torch._inductor",
    "torch.onnx",
    "gymnasium",
    "gymnasium.envs.classic_control",
    "safetensors.torch",
    "lensemble.config",
    "lensemble.data.trajectories",
    "lensemble.model.worldmodel",
    "lensemble.model.inner_loop",
    "lensemble.ranks.sharded_loss",
    "lensemble.ranks.worker",
)
#: Key on node 0's board: the rendezvous id of the launch node 0 is about to make.
_NEXT_LAUNCH = "lensemble/next-launch"
#: What :func:`new_run_id` makes (participant ids are short slugs).
_RUN_ID = re.compile(r"lensemble-[A-Za-z0-9_.-]{1,64}-[0-9a-f]{12}")
#: Pause between two looks at the board while waiting for node 0's next launch (seconds).
_POLL_S = 0.2


#: torch's loggers that report a dead rank: the elastic agent's process context and spawn.
ELASTIC_LOGGER = "torch.distributed.elastic.multiprocessing.api"
SPAWN_LOGGER = "torch.multiprocessing.spawn"


class RankDeaths(logging.Filter):
    """Holds back torch's report of ranks that died without a Python error, during one launch.

    Installed on :data:`ELASTIC_LOGGER` and :data:`SPAWN_LOGGER` only while
    :func:`launch_round` runs. It drops a record whose exception is torch's
    ``ProcessExitedException`` (the rank was killed by a signal or exited with a code: no
    traceback of the rank's own exists) and records the rank instead, and drops spawn's warning
    that it is terminating the other ranks after a failure. A ``ProcessRaisedException`` (the
    rank's own traceback), spawn's failure to stop a rank, and every other record pass.

    Attributes:
        deaths: One phrase per rank held back, e.g. ``local rank 1 (pid 3469) killed by
            SIGKILL``, in the order torch reported them.
    """

    def __init__(self) -> None:
        super().__init__()
        self.deaths: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        """False for the records described above (they are not printed), True otherwise."""
        from torch.multiprocessing.spawn import ProcessExitedException

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, ProcessExitedException):
            how = (
                f"killed by {exc.signal_name}"
                if exc.signal_name
                else f"exited with code {exc.exit_code}"
            )
            self.deaths.append(f"local rank {exc.error_index} (pid {exc.error_pid}) {how}")
            return False
        return not (
            record.name == SPAWN_LOGGER
            and record.levelno == logging.WARNING
            and str(record.msg).startswith("Terminating process")
        )


def new_run_id(participant_id: str) -> str:
    """A fresh rendezvous id for one launch (a one-node group's, or one node 0 announces)."""
    return f"lensemble-{participant_id}-{uuid.uuid4().hex[:12]}"


class LaunchBoard:
    """Where node 0 of a multi-node group names each launch's rendezvous id for the other nodes.

    It is a key in a TCPStore on ``LENSEMBLE_RENDEZVOUS_HOST:rendezvous_port`` that node 0 hosts
    for as long as its learner lives; torch's c10d rendezvous of every launch shares that server
    (multi-tenant) under the launch's own id. Use :meth:`host` on node 0 and :meth:`join` on the
    others.
    """

    def __init__(self, store: TCPStore, where: str) -> None:
        self._store = store
        self._where = where

    @classmethod
    def host(cls, layout: RankLayout) -> LaunchBoard:
        """Node 0: serve the board on the rendezvous port (the launches' store shares it).

        Raises:
            RankFailure: The port is taken by another process.
        """
        from torch._C._distributed_c10d import TCPStore  # torch.distributed re-exports it

        where = f"{rendezvous_host()}:{layout.rendezvous_port}"
        try:
            store = TCPStore(
                rendezvous_host(),
                layout.rendezvous_port,
                is_master=True,
                multi_tenant=True,
                timeout=timedelta(seconds=60),
            )
        except (RuntimeError, ValueError) as exc:
            raise RankFailure(
                f"node 0 cannot serve its rank group's rendezvous on {where} ({exc});",
                remediation="free the port or set another rendezvous_port in the rank layout.",
            ) from None
        return cls(store, where)

    @classmethod
    def join(cls, layout: RankLayout, timeout_s: float) -> LaunchBoard:
        """A node of rank > 0: connect to node 0's board, waiting up to ``timeout_s`` seconds.

        Raises:
            RankFailure: Node 0 did not answer within ``timeout_s``.
        """
        from torch._C._distributed_c10d import TCPStore  # torch.distributed re-exports it

        where = f"{rendezvous_host()}:{layout.rendezvous_port}"
        try:
            store = TCPStore(
                rendezvous_host(),
                layout.rendezvous_port,
                is_master=False,
                timeout=timedelta(seconds=timeout_s),
            )
        except (RuntimeError, ValueError) as exc:
            raise RankFailure(
                f"node 0's rendezvous at {where} did not answer within {timeout_s:.0f} s ({exc});",
                remediation=f"start node 0 first and check {RENDEZVOUS_HOST_ENV}.",
            ) from None
        return cls(store, where)

    def announce(self, participant_id: str) -> str:
        """Node 0: name (and return) the rendezvous id of the launch it is about to make."""
        run_id = new_run_id(participant_id)
        self._store.set(_NEXT_LAUNCH, run_id)
        return run_id

    def next_launch(self, last: str | None, timeout_s: float) -> str:
        """A node of rank > 0: the id node 0 names after ``last``, waiting up to ``timeout_s`` s.

        Raises:
            RankFailure: Node 0 named no new launch in time, or its board went away.
        """
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                if self._store.check([_NEXT_LAUNCH]):
                    run_id = self._store.get(_NEXT_LAUNCH).decode("utf-8")
                    # Bytes from the network: only an id new_run_id could have made goes on.
                    if not _RUN_ID.fullmatch(run_id):
                        raise ValueError(f"not a launch id: {run_id[:80]!r}")
                    if run_id != last:
                        return run_id
                if time.monotonic() > deadline:
                    break
                time.sleep(_POLL_S)
        except (RuntimeError, ValueError) as exc:  # DistNetworkError and kin: node 0 is gone
            raise RankFailure(
                f"node 0's rendezvous at {self._where} went away ({exc});",
                remediation="look at node 0's participant process.",
            ) from None
        raise RankFailure(
            f"node 0 started no launch at {self._where} within {timeout_s:.0f} s;",
            remediation="look at node 0's participant process.",
        )


def launch_round(
    layout: RankLayout, folder: Path, run_id: str, rendezvous_timeout_s: float
) -> list[str]:
    """Run :func:`lensemble.ranks.worker.rank_main` on this node's ranks for one round.

    Args:
        layout: The participant's rank layout.
        folder: The round folder (:mod:`lensemble.ranks.exchange`).
        run_id: Rendezvous id of this launch, the same on every node of the group and never
            used by another launch (:func:`new_run_id`, :class:`LaunchBoard`).
        rendezvous_timeout_s: How long to wait for every node at the rendezvous (seconds); the
            callers pass ``federation.join_timeout_s``, outside the config hash, since a
            timeout changes nothing that is trained.

    Returns:
        One phrase per rank of this node that died without a Python error during the launch
        (:class:`RankDeaths`; torch's report of it is held back), empty when none did.

    Raises:
        RankFailure: The group failed more often than ``layout.max_restarts`` within the
            round (torch's ``ChildFailedError``, summarised with the dead ranks).
        RendezvousError: torch's, when the nodes did not meet (another node left, or did not
            come within ``rendezvous_timeout_s``).
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from lensemble.ranks.worker import rank_main

    host = rendezvous_host()
    if START_METHOD == "forkserver":
        _preload_fork_server()
    config = LaunchConfig(
        min_nodes=layout.nodes,
        max_nodes=layout.nodes,
        nproc_per_node=layout.processes_per_node,
        run_id=run_id,
        rdzv_backend="c10d",
        rdzv_endpoint=f"{host}:{rendezvous_port(layout)}",
        rdzv_configs={"is_host": node_rank(layout) == 0},
        rdzv_timeout=max(1, math.ceil(rendezvous_timeout_s)),
        max_restarts=layout.max_restarts,
        monitor_interval=0.1,
        start_method=START_METHOD,
    )
    # The agent installs its own handlers for these signals in the main thread and leaves them
    # there: put ours back, and hand a signal that arrived during the launch to them.
    saved = {sig: signal.getsignal(sig) for sig in _HANDLED}
    deaths = RankDeaths()
    loggers = [logging.getLogger(name) for name in (ELASTIC_LOGGER, SPAWN_LOGGER)]
    for logger in loggers:
        logger.addFilter(deaths)
    try:
        elastic_launch(config, rank_main)(str(folder))
    except SignalException as exc:
        _restore(saved)
        signal.raise_signal(exc.sigval)
        raise  # the previous handler ignored it: the round is still lost
    except ChildFailedError as exc:
        died = f"; died: {', '.join(deaths.deaths)}" if deaths.deaths else ""
        raise RankFailure(
            f"the rank group failed {layout.max_restarts + 1} times in one round "
            f"({len(exc.failures)} rank(s) in the last try{died});",
            remediation="see the ranks' errors above; raise max_restarts of the rank layout "
            "if the failures are transient.",
        ) from None
    finally:
        for logger in loggers:
            logger.removeFilter(deaths)
        _restore(saved)
        if layout.nodes > 1:
            # The agent's rendezvous store (a server thread in this process) can outlive the
            # launch in a reference cycle and keep the port the next launch needs: free it now
            # rather than at some later time. A one-node group's store took a free port and no
            # launch needs it again; a full collection of a large process costs 0.5 to 0.9 s
            # (docs/performance.md#rank-groups-in-process).
            gc.collect()
    return deaths.deaths


def _preload_fork_server() -> None:
    """Name what the fork server imports; it takes effect when the server first starts."""
    import multiprocessing

    multiprocessing.set_forkserver_preload(list(PRELOAD))


def start_fork_server() -> None:
    """Start the fork server now, so that its imports overlap the participant's other work.

    Idempotent; the first launch waits for the server's imports only if they are not done.
    """
    if START_METHOD != "forkserver":
        return
    from multiprocessing import forkserver

    _preload_fork_server()
    forkserver.ensure_running()


def rendezvous_port(layout: RankLayout) -> int:
    """The TCP port a launch's c10d rendezvous listens on: ``rendezvous_port`` across nodes.

    A one-node group's ranks all run on this host, so it takes a free port (0: the store
    binds one) and no two groups on one host can clash; the other nodes of a multi-node group
    must know the port, so it is the layout's.
    """
    return layout.rendezvous_port if layout.nodes > 1 else 0


def _restore(saved: dict[signal.Signals, Any]) -> None:
    if threading.current_thread() is threading.main_thread():
        for sig, handler in saved.items():
            signal.signal(sig, handler)
