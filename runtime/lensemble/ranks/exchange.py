"""The round folder through which a participant hands one round to its rank group and back.

Everything in it is written by the participant process on node rank 0 or by its rank 0, in a
folder only this user can read (mode 0700): tensors as safetensors, the job as JSON. Nothing is
pickled. Files:

=====================  ======================================================================
``job.json``           :class:`RoundJob`, written by the participant
``global.safetensors`` the global model theta_t (read by rank 0, broadcast to every rank)
``inner.safetensors``  the inner optimizer state before the round (absent before round 0)
``local.safetensors``  theta_c after the inner steps (written by rank 0)
``inner-out.safetensors`` the inner optimizer state after the round (written by rank 0)
``result.json``        mean loss and compute seconds (written by rank 0)
``rank_failure``       present when a rank died this round (written by the restarted rank 0)
``stopped``            on a node of rank > 0: node 0 ended the group (the run is over)
=====================  ======================================================================
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

JOB = "job.json"
GLOBAL = "global.safetensors"
INNER = "inner.safetensors"
LOCAL = "local.safetensors"
INNER_OUT = "inner-out.safetensors"
RESULT = "result.json"
FAILED = "rank_failure"
STOPPED = "stopped"


@dataclass(frozen=True)
class RoundJob:
    """What the rank group is asked to do for one round.

    Attributes:
        config_json: The run's config as JSON (``LensembleConfig.model_dump_json``).
        participant_id: The participant whose data the ranks train on.
        round_index: The round (seeds the batches).
        steps: Inner steps ``H`` (count).
        kill_rank: Rank that kills itself after its first inner step (the ``rank_kill`` fault),
            or -1 for none.
        stop: Node 0 tells the other nodes' ranks that the run is over (no training).

    On a node of rank > 0 only ``config_json`` and ``participant_id`` are its own: the rest
    reaches its ranks from rank 0 (:func:`lensemble.ranks.worker.rank_main`).
    """

    config_json: str
    participant_id: str
    round_index: int
    steps: int
    kill_rank: int = -1
    stop: bool = False

    def write(self, folder: Path) -> None:
        """Write ``job.json`` into ``folder``."""
        (folder / JOB).write_text(json.dumps(asdict(self)), encoding="utf-8")

    @classmethod
    def read(cls, folder: Path) -> RoundJob:
        """Read ``job.json`` from ``folder`` (written by :meth:`write`)."""
        raw = json.loads((folder / JOB).read_text(encoding="utf-8"))
        return cls(
            config_json=str(raw["config_json"]),
            participant_id=str(raw["participant_id"]),
            round_index=int(raw["round_index"]),
            steps=int(raw["steps"]),
            kill_rank=int(raw["kill_rank"]),
            stop=bool(raw.get("stop", False)),
        )


@dataclass(frozen=True)
class RoundResult:
    """Rank 0's statistics of one round.

    Attributes:
        mean_loss: Mean total loss over the steps and the global batch (unitless).
        compute_seconds: Wall time of the inner steps on rank 0 (seconds).
    """

    mean_loss: float
    compute_seconds: float

    def write(self, folder: Path) -> None:
        """Write ``result.json`` into ``folder``."""
        (folder / RESULT).write_text(json.dumps(asdict(self)), encoding="utf-8")

    @classmethod
    def read(cls, folder: Path) -> RoundResult:
        """Read ``result.json`` from ``folder``."""
        raw = json.loads((folder / RESULT).read_text(encoding="utf-8"))
        return cls(float(raw["mean_loss"]), float(raw["compute_seconds"]))
