"""Atomic checkpoints of the coordinator and of each participant's inner state.

Coordinator: ``<output_dir>/coordinator/checkpoints/model-v<version>.safetensors`` holds the
global parameters, the outer momentum (``momentum::<name>``) and, in its metadata, the version,
model hash, parent hash and config hash. It is written to a temporary file, fsynced, and renamed
into place, so a crash never leaves a half-written checkpoint. On load the model hash is
recomputed and compared (docs/concepts.md#checkpoint-integrity). The last ``KEEP`` checkpoints
are kept.

Participant: ``<output_dir>/participants/<id>/state/inner-r<round>-a<attempt>.safetensors`` holds
the learner's inner state after that training, inside the participant's own folder.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from lensemble.errors import IntegrityError, PayloadError
from lensemble.federation.payload import decode, encode, model_hash

MOMENTUM_PREFIX = "momentum::"
KEEP = 3
_MODEL_FILE = re.compile(r"^model-v(\d{6})\.safetensors$")
_INNER_FILE = re.compile(r"^inner-r(\d{6})-a(\d{3})\.safetensors$")


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same folder, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclass(frozen=True)
class CoordinatorCheckpoint:
    """The coordinator's global state after committing model ``version``.

    Attributes:
        version: Model version (round ``version - 1`` committed it; 0 is the initial model).
        params: Global parameters, name -> float32 tensor.
        momentum: Outer momentum buffer, name -> float32 tensor.
        model_hash: Hash of this version.
        parent_hash: Hash of the previous version (``""`` for version 0).
        config_hash: Config hash of the run.
        config_view: The hashed part of the config as canonical JSON (``hashing.hashed_view``),
            so a resume with another config can name the fields that differ.
    """

    version: int
    params: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor]
    model_hash: str
    parent_hash: str
    config_hash: str
    config_view: str = ""


class CheckpointStore:
    """Coordinator checkpoints under ``<output_dir>/coordinator/checkpoints``."""

    def __init__(self, output_dir: Path) -> None:
        self.folder = output_dir / "coordinator" / "checkpoints"

    def save(
        self, ckpt: CoordinatorCheckpoint, extra_metadata: Mapping[str, str] | None = None
    ) -> Path:
        """Write a checkpoint atomically and prune old ones; returns its path.

        Args:
            ckpt: The state to save.
            extra_metadata: More header strings (the coordinator stores the round's ledger line,
                so a crash between checkpoint and ledger append loses nothing).
        """
        tensors = dict(ckpt.params)
        tensors.update({MOMENTUM_PREFIX + k: v for k, v in ckpt.momentum.items()})
        data = encode(
            tensors,
            {
                "kind": "coordinator-checkpoint",
                "version": str(ckpt.version),
                "model_hash": ckpt.model_hash,
                "parent_hash": ckpt.parent_hash,
                "config_hash": ckpt.config_hash,
                "config_view": ckpt.config_view,
                **(extra_metadata or {}),
            },
        )
        path = self.folder / f"model-v{ckpt.version:06d}.safetensors"
        atomic_write(path, data)
        for old in self.versions()[:-KEEP]:
            (self.folder / f"model-v{old:06d}.safetensors").unlink(missing_ok=True)
        return path

    def versions(self) -> list[int]:
        """Versions with a checkpoint on disk, ascending."""
        if not self.folder.is_dir():
            return []
        found = (_MODEL_FILE.match(p.name) for p in self.folder.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def load(self, version: int | None = None) -> CoordinatorCheckpoint | None:
        """Load a checkpoint (the latest when ``version`` is None), verifying its hash.

        Returns:
            The checkpoint, or None when there is none.

        Raises:
            IntegrityError: The file is corrupt or its tensors do not hash to its model hash.
        """
        versions = self.versions()
        if not versions:
            return None
        version = versions[-1] if version is None else version
        path = self.folder / f"model-v{version:06d}.safetensors"
        try:
            decoded = decode(path.read_bytes())
        except (OSError, PayloadError) as exc:
            raise IntegrityError(
                f"checkpoint {path} cannot be read ({exc});",
                remediation="delete it to resume from the previous checkpoint.",
            ) from None
        meta = decoded.metadata
        params = {k: v for k, v in decoded.tensors.items() if not k.startswith(MOMENTUM_PREFIX)}
        momentum = {
            k.removeprefix(MOMENTUM_PREFIX): v
            for k, v in decoded.tensors.items()
            if k.startswith(MOMENTUM_PREFIX)
        }
        expected = meta.get("model_hash", "")
        actual = model_hash(params, int(meta.get("version", -1)), meta.get("parent_hash", ""))
        if actual != expected or int(meta.get("version", -1)) != version:
            raise IntegrityError(
                f"checkpoint {path} does not match its recorded hash (recorded {expected[:19]}..., "
                f"recomputed {actual[:19]}...);",
                remediation="the file was modified; delete it to resume from the previous one.",
            )
        return CoordinatorCheckpoint(
            version=version,
            params=params,
            momentum=momentum,
            model_hash=expected,
            parent_hash=meta.get("parent_hash", ""),
            config_hash=meta.get("config_hash", ""),
            config_view=meta.get("config_view", ""),
        )


class InnerStateStore:
    """A participant's inner-state snapshots, inside its own folder."""

    def __init__(self, output_dir: Path, participant_id: str) -> None:
        self.folder = output_dir / "participants" / participant_id / "state"

    def save(self, round_index: int, attempt: int, state: Mapping[str, torch.Tensor]) -> None:
        """Save the inner state after training ``(round_index, attempt)``.

        Snapshots of the two most recent rounds are kept: resuming before round ``t`` needs the
        last snapshot of round ``t - 1`` even when round ``t`` had several attempts.
        """
        path = self.folder / f"inner-r{round_index:06d}-a{attempt:03d}.safetensors"
        atomic_write(path, encode(dict(state), {"kind": "inner-state"}))
        rounds = sorted({e[0] for e in self._entries()})
        for old in self._entries():
            if old[0] < rounds[-2:][0]:
                (self.folder / old[2]).unlink(missing_ok=True)

    def discard(self, round_index: int, attempt: int) -> None:
        """Delete the snapshot taken after training ``(round_index, attempt)``, if any."""
        path = self.folder / f"inner-r{round_index:06d}-a{attempt:03d}.safetensors"
        path.unlink(missing_ok=True)

    def _entries(self) -> list[tuple[int, int, str]]:
        if not self.folder.is_dir():
            return []
        found = ((_INNER_FILE.match(p.name), p.name) for p in self.folder.iterdir())
        return sorted((int(m.group(1)), int(m.group(2)), name) for m, name in found if m)

    def latest_before(
        self, round_index: int, attempt: int = 0
    ) -> tuple[tuple[int, int], dict[str, torch.Tensor]] | None:
        """The last snapshot taken before training ``(round_index, attempt)``, if any.

        Returns:
            ``((round, attempt), state)`` of that snapshot, or None.
        """
        candidates = [e for e in self._entries() if (e[0], e[1]) < (round_index, attempt)]
        if not candidates:
            return None
        r, a, name = candidates[-1]
        return (r, a), decode((self.folder / name).read_bytes()).tensors
