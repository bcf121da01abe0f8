"""The ranks of a participant on a node of rank > 0: they train what node 0's rank 0 says.

Only node 0 talks to the coordinator. ``lensemble participant`` started with
``LENSEMBLE_NODE_RANK`` > 0 calls :func:`follow`: it launches this node's ranks for the next
round again and again; each launch meets node 0's at the c10d rendezvous, its ranks receive the
round, the global model and the inner state from rank 0, and train their rows. Node 0 ends the
loop with a last launch whose job says ``stop`` (:meth:`RankGroupLearner.close`).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from lensemble.errors import RankFailure, RankGroupExhausted
from lensemble.ranks.exchange import STOPPED, RoundJob
from lensemble.ranks.launch import launch_round

if TYPE_CHECKING:
    from lensemble.config.schema import LensembleConfig

_log = logging.getLogger("lensemble.ranks.follow")

#: Pause before joining again after a rendezvous that did not form (node 0 between rounds).
RETRY_S = 1.0


def follow(config: LensembleConfig, participant_id: str) -> int:
    """Serve this node's ranks of ``participant_id``'s group until node 0 ends it.

    Returns:
        Rounds this node's ranks trained (count).

    Raises:
        RankGroupExhausted: More rounds lost to dead ranks than the layout's ``max_restarts``.
    """
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    from lensemble.data.trajectories import load_or_collect

    layout = config.rank_layout(participant_id)
    load_or_collect(config, participant_id)  # the cache every rank reads, written once
    fed = config.federation
    # Node 0 may spend a whole round (and its retries) between two launches.
    wait_s = int(fed.join_timeout_s + fed.round_timeout_s * (fed.max_round_retries + 2))
    root = Path(tempfile.mkdtemp(prefix=f"lensemble-ranks-{participant_id}-"))
    trained = failures = 0
    try:
        while True:
            folder = root / f"launch-{trained + failures}"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(mode=0o700)
            RoundJob(config.model_dump_json(), participant_id, -1, 0).write(folder)
            try:
                launch_round(layout, folder, f"lensemble-{participant_id}", wait_s)
            except RankFailure as exc:
                failures += 1
                _log.warning("%s", exc)
                if failures > layout.max_restarts:
                    raise RankGroupExhausted(
                        f"participant '{participant_id}' lost {failures} rounds on this node to "
                        f"dead ranks, more than max_restarts={layout.max_restarts};",
                        remediation="look at the ranks' errors, then fix the node.",
                    ) from None
                continue
            except RendezvousError as exc:  # node 0 closed the last group before we met it
                _log.info("rendezvous did not form (%s); joining again", exc)
                time.sleep(RETRY_S)
                continue
            if (folder / STOPPED).exists():
                return trained
            trained += 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
