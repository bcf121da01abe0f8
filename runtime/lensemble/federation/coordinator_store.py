"""The coordinator's durable record: its checkpoints, its ledger, and a resume from both.

A commit is written checkpoint first, then ledger line (the order a resume relies on,
docs/run-record.md); :meth:`CoordinatorStore.restore` continues from a record
:func:`lensemble.federation.verify.require_valid` verified, without reading or checking it again.
Without an output folder nothing is written and nothing can be resumed.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from lensemble.config import LensembleConfig, config_hash
from lensemble.config.hashing import canonical_json, differing_paths, hashed_view
from lensemble.errors import ConfigError, IntegrityError
from lensemble.federation.checkpoint import CheckpointStore, CoordinatorCheckpoint
from lensemble.federation.checkpoint_audit import MOMENTUM_PREFIX, AuditedCheckpoint
from lensemble.federation.ledger import Ledger, RoundRecord
from lensemble.federation.payload import encode
from lensemble.federation.signing import Signer
from lensemble.federation.verify import VerifiedRecord
from lensemble.machinery.flat import flat_copy

Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ModelState:
    """The global model at one version: what a checkpoint holds and a round starts from.

    Attributes:
        version: Model version (= rounds committed).
        params: Global parameters, name -> float32 tensor (one flat buffer).
        momentum: Outer momentum, name -> float32 tensor (one flat buffer).
        model_hash: Hash of ``params`` at ``version`` (chained to the parent).
        parent_hash: The previous version's hash (``""`` for version 0).
    """

    version: int
    params: Params
    momentum: Params
    model_hash: str
    parent_hash: str


class CommittedModel:
    """Read-only views of the committed model of a holder of ``state`` (the coordinator)."""

    state: ModelState

    @property
    def version(self) -> int:
        """The global model's version (= rounds committed)."""
        return self.state.version

    @property
    def params(self) -> Params:
        """The global model, name -> float32 tensor."""
        return self.state.params

    @property
    def momentum(self) -> Params:
        """The outer momentum, name -> float32 tensor."""
        return self.state.momentum

    @property
    def model_hash(self) -> str:
        """The global model's hash."""
        return self.state.model_hash

    @property
    def parent_hash(self) -> str:
        """The previous version's hash (``""`` at version 0)."""
        return self.state.parent_hash


class CoordinatorStore:
    """Checkpoints under ``<output_dir>/coordinator/checkpoints`` and the ledger beside them.

    Args:
        config: The run's config (its hash and hashed view go into every checkpoint).
        output_dir: The run folder, or None to keep nothing.
        signer: Signs checkpoints and ledger lines when given.
    """

    def __init__(
        self, config: LensembleConfig, output_dir: Path | None, signer: Signer | None
    ) -> None:
        self.config = config
        self.config_hash = config_hash(config)
        self.checkpoints = CheckpointStore(output_dir, signer) if output_dir else None
        ledger_name = config.observability.ledger_path
        self.ledger = Ledger(output_dir / ledger_name, signer) if output_dir else None

    def checkpoint_of(self, state: ModelState, record: RoundRecord | None) -> CoordinatorCheckpoint:
        """The checkpoint of ``state``, committed by ``record`` (None for version 0)."""
        # The tensors are referenced, not copied: nothing changes them before the commit is
        # settled (the next outer step waits for it).
        return CoordinatorCheckpoint(
            state.version,
            state.params,
            state.momentum,
            state.model_hash,
            state.parent_hash,
            self.config_hash,
            canonical_json(hashed_view(self.config)).decode(),
            record.to_json() if record else "",
        )

    def pin(self, version: int) -> None:
        """Keep checkpoint ``version`` whatever its age (the divergence guard's best model)."""
        if self.checkpoints is not None:
            self.checkpoints.pinned = version

    def pin_kept(self, version: int) -> None:
        """Keep checkpoint ``version`` whatever its age (the best reported version)."""
        if self.checkpoints is not None:
            self.checkpoints.kept = version

    def save(self, state: ModelState, record: RoundRecord | None) -> str | None:
        """Write the checkpoint of ``state``; returns its state hash (None without a folder).

        Raises:
            DiskFull: No room for it (nothing is left behind).
        """
        if self.checkpoints is None:
            return None
        return self.checkpoints.save(self.checkpoint_of(state, record))

    def append(self, record: RoundRecord, checkpoint: str | None) -> None:
        """Append ``record``'s ledger line, naming the checkpoint it committed (if any)."""
        if self.ledger is not None:
            self.ledger.append(record, checkpoint)

    def write_commit(self, record: RoundRecord, ckpt: CoordinatorCheckpoint | None) -> float:
        """Checkpoint, then ledger line (the order a resume relies on); returns seconds."""
        start = time.perf_counter()
        checkpoint = self.checkpoints.save(ckpt) if (self.checkpoints and ckpt) else None
        self.append(record, checkpoint)
        return time.perf_counter() - start

    def restore(
        self, ckpt: AuditedCheckpoint, verified: VerifiedRecord
    ) -> tuple[ModelState, list[RoundRecord]]:
        """Continue from the verified newest checkpoint (its tensors are copied, then dropped).

        Returns:
            The model state, and the records of the attempts before it (the ledger's lines up
            to the checkpoint; later attempts are dropped, the resume redoes that round).

        Raises:
            ConfigError: The checkpoint was written with another config (only
                ``federation.rounds`` may change).
            IntegrityError: The ledger lacks the round the checkpoint commits.
        """
        self._require_same_config(ckpt)
        assert ckpt.tensors is not None  # require_valid keeps the newest checkpoint's
        tensors = {name: torch.from_numpy(array) for name, array in ckpt.tensors.items()}
        params = {k: v for k, v in tensors.items() if not k.startswith(MOMENTUM_PREFIX)}
        momentum = {
            k.removeprefix(MOMENTUM_PREFIX): v
            for k, v in tensors.items()
            if k.startswith(MOMENTUM_PREFIX)
        }
        state = ModelState(
            ckpt.version, flat_copy(params), flat_copy(momentum), ckpt.model_hash, ckpt.parent_hash
        )
        earlier = self._repair_ledger(verified, state.version) if self.ledger else []
        return state, earlier

    def _require_same_config(self, ckpt: AuditedCheckpoint) -> None:
        if ckpt.config_hash == self.config_hash:
            return
        try:
            previous = json.loads(ckpt.config_view)
        except (ValueError, RecursionError):
            previous = None
        changed = (
            differing_paths(previous, hashed_view(self.config))
            if isinstance(previous, dict)
            else ["(unknown: the checkpoint does not record its config)"]
        )
        changed = [path for path in changed if path != "federation.rounds"]
        if changed:
            raise ConfigError(
                f"the checkpoint in {self.checkpoints.folder if self.checkpoints else ''} "
                f"was written with another config (differing: {', '.join(changed)}); "
                "resume with the same config (only federation.rounds may change) or use a "
                "new run.output_dir."
            )

    def _repair_ledger(self, verified: VerifiedRecord, version: int) -> list[RoundRecord]:
        """Drop the lines of attempts after the checkpoint (the resume redoes that round).

        The lost or torn line of the checkpoint's own round was restored by ``require_valid``.
        """
        assert self.ledger is not None
        lines = verified.lines
        kept = [line for line in lines if line.record.round < version]
        if len(kept) != len(lines):
            dropped = len(lines) - len(kept)
            self.ledger.rewrite_texts(
                (line.text for line in kept),
                why=f"drops its last {dropped} line(s), attempts of round {version} after "
                f"checkpoint v{version} (the resume redoes that round)",
                old=verified.raw,
            )
        if version > 0 and not any(
            line.record.round == version - 1 and line.record.state == "closed" for line in kept
        ):
            raise IntegrityError(
                f"the ledger lacks round {version - 1}, which the checkpoint commits;",
                remediation="run `lensemble verify` on the folder; use a new run.output_dir.",
            )
        self.ledger.continue_after(kept)
        return [line.record for line in kept]


def model_payload_of(state: ModelState) -> bytes:
    """``state``'s global model as the safetensors payload every participant downloads."""
    return encode(
        state.params,
        {
            "kind": "global-model",
            "version": str(state.version),
            "model_hash": state.model_hash,
            "parent_hash": state.parent_hash,
        },
    )
