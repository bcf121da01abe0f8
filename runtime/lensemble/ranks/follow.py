"""The ranks of a participant on a node of rank > 0: they train what node 0's rank 0 says.

Only node 0 talks to the coordinator. ``lensemble participant`` started with
``LENSEMBLE_NODE_RANK`` > 0 calls :func:`follow`: it waits for node 0 to name its next launch on
the :class:`~lensemble.ranks.launch.LaunchBoard`, launches this node's ranks under that
rendezvous id, and does so again and again; each launch meets node 0's at the c10d rendezvous,
its ranks receive the round, the global model and the inner state from rank 0, and train their
rows. Node 0 ends the loop with a last launch whose job says ``stop``
(:meth:`RankGroupLearner.close`).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from lensemble.errors import RankFailure, RankGroupExhausted
from lensemble.ranks.exchange import STOPPED, RoundJob
from lensemble.ranks.launch import LaunchBoard, launch_round

if TYPE_CHECKING:
    from lensemble.config.schema import LensembleConfig

_log = logging.getLogger("lensemble.ranks.follow")


def follow(config: LensembleConfig, participant_id: str) -> int:
    """Serve this node's ranks of ``participant_id``'s group until node 0 ends it.

    Returns:
        Rounds this node's ranks trained (count).

    Raises:
        RankGroupExhausted: More rounds lost to dead ranks than the layout's ``max_restarts``.
        RankFailure: Node 0 did not answer, went away, or started no launch for longer than a
            round and its retries.
    """
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    from lensemble.data.trajectories import load_or_collect

    layout = config.rank_layout(participant_id)
    load_or_collect(config, participant_id)  # the cache every rank reads, written once
    fed = config.federation
    # Node 0 may spend a whole round (and its retries) between two launches.
    wait_s = int(fed.join_timeout_s + fed.round_timeout_s * (fed.max_round_retries + 2))
    board = LaunchBoard.join(layout, wait_s)
    root = Path(tempfile.mkdtemp(prefix=f"lensemble-ranks-{participant_id}-"))
    trained = failures = 0
    run_id: str | None = None
    try:
        while True:
            run_id = board.next_launch(run_id, wait_s)
            folder = root / f"launch-{trained + failures}"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(mode=0o700)
            RoundJob(config.model_dump_json(), participant_id, -1, 0).write(folder)
            try:
                deaths = launch_round(layout, folder, run_id, fed.join_timeout_s)
            except RankFailure as exc:
                failures += 1
                _log.warning("%s", exc)
                if failures > layout.max_restarts:
                    raise RankGroupExhausted(
                        f"participant '{participant_id}' lost {failures} "
                        f"{'round' if failures == 1 else 'rounds'} on this node to "
                        f"dead ranks, more than max_restarts={layout.max_restarts};",
                        remediation="look at the ranks' errors, then fix the node.",
                    ) from None
                continue
            except RendezvousError as exc:  # node 0 gave this launch up: wait for its next
                _log.warning(
                    "the rank group did not meet (%s); waiting for node 0's next launch", exc
                )
                continue
            if (folder / STOPPED).exists():
                return trained
            if deaths:  # torch's report of them is held back (ranks.launch.RankDeaths)
                _log.warning(
                    "a rank of participant '%s' on this node died (%s); node 0 records the "
                    "round as rank_failure and the group meets again for the next one",
                    participant_id,
                    "; ".join(deaths),
                )
            trained += 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
