"""Atomic checkpoints of the coordinator and of each participant's inner state.

Coordinator: ``<output_dir>/coordinator/checkpoints/model-v<version>.safetensors`` holds the
global parameters, the outer momentum (``momentum::<name>``) and, in its metadata, the version,
model hash, parent hash, config hash, the round record it commits (``record``) and its
``state_hash``: one hash over parameters, momentum, version, hashes and record
(:func:`state_hash`), which the round's ledger line carries, plus a MAC of it on signed runs. It
is written durably (:func:`lensemble.durable.atomic_write`), after checking the folder has room,
so a crash or a full disk never leaves a half-written checkpoint. On load the model hash and the
state hash are recomputed and compared (docs/run-record.md). The last ``KEEP`` checkpoints are
kept, and the divergence guard's best model (``CheckpointStore.pinned``) and the best reported
version a run may end with (``CheckpointStore.kept``, ``federation.final_model``) whatever their
age.

Participant: ``<output_dir>/participants/<id>/state/inner-r<round>-a<attempt>.safetensors`` holds
the learner's inner state after that training, inside the participant's own folder.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from lensemble.config.sizing import CHECKPOINTS_KEPT
from lensemble.durable import atomic_write, check_free_space
from lensemble.errors import IntegrityError, PayloadError
from lensemble.federation.checkpoint_audit import (
    MOMENTUM_PREFIX,
    mac_refusal,
    recorded_version_of,
    require_config_view,
    require_momentum,
    require_recorded_version,
)
from lensemble.federation.payload import decode, encode_parts, model_hash, tensor_digest
from lensemble.federation.signing import Signer

KEEP = CHECKPOINTS_KEPT  # the coordinator volume is sized for it (config.sizing)
_MODEL_FILE = re.compile(r"^model-v(\d{6})\.safetensors$")
_INNER_FILE = re.compile(r"^inner-r(\d{6})-a(\d{3})\.safetensors$")


_STATE_DOMAIN = b"lensemble/coordinator-state/v1\x00"

__all__ = ["CheckpointStore", "CoordinatorCheckpoint", "InnerStateStore", "atomic_write"]


def state_hash(
    params: Mapping[str, torch.Tensor],
    momentum: Mapping[str, torch.Tensor],
    *,
    version: int,
    model_hash_: str,
    parent_hash: str,
    config_hash: str,
    record_json: str,
) -> str:
    """Hash of everything a resume continues from: parameters, momentum and the round record.

    Args:
        params: Global parameters, name -> tensor.
        momentum: Outer momentum, name -> tensor (bound under ``momentum::<name>``).
        version: Model version.
        model_hash_: The model hash of ``params``.
        parent_hash: The parent model's hash.
        config_hash: The run's config hash.
        record_json: Canonical JSON of the round record the checkpoint commits (``""`` for v0).

    Returns:
        ``"sha256:<64 hex>"``.
    """
    tensors = dict(params)
    tensors.update({MOMENTUM_PREFIX + k: v for k, v in momentum.items()})
    suffix = _STATE_DOMAIN + struct.pack("<Q", version)
    for text in (model_hash_, parent_hash, config_hash, record_json):
        encoded = text.encode()
        suffix += struct.pack("<Q", len(encoded)) + encoded
    return "sha256:" + tensor_digest(tensors, suffix)


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
        record: Canonical JSON of the round record this version commits (``""`` for v0).
        state_hash: :func:`state_hash` of this checkpoint (set by load; save computes it).
    """

    version: int
    params: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor]
    model_hash: str
    parent_hash: str
    config_hash: str
    config_view: str = ""
    record: str = ""
    state_hash: str = ""

    def computed_state_hash(self) -> str:
        """:func:`state_hash` recomputed from this checkpoint's contents."""
        return state_hash(
            self.params,
            self.momentum,
            version=self.version,
            model_hash_=self.model_hash,
            parent_hash=self.parent_hash,
            config_hash=self.config_hash,
            record_json=self.record,
        )


class CheckpointStore:
    """Coordinator checkpoints under ``<output_dir>/coordinator/checkpoints``.

    Args:
        output_dir: The run folder.
        signer: Adds a MAC of each checkpoint's state hash when given.
    """

    def __init__(self, output_dir: Path, signer: Signer | None = None) -> None:
        self.folder = output_dir / "coordinator" / "checkpoints"
        self.signer = signer
        #: A version kept beside the last ``KEEP`` (the divergence guard's best model), if any.
        self.pinned: int | None = None
        #: The best reported version a run may end with (``federation.final_model``), if any.
        self.kept: int | None = None

    def path(self, version: int) -> Path:
        """Where checkpoint ``version`` lives."""
        return self.folder / f"model-v{version:06d}.safetensors"

    def save(self, ckpt: CoordinatorCheckpoint) -> str:
        """Write a checkpoint durably and prune old ones; returns its state hash.

        Args:
            ckpt: The state to save (its ``record`` is stored, so a crash between checkpoint and
                ledger append loses nothing; its ``state_hash`` field is ignored and recomputed).

        Raises:
            DiskFull: The folder has no room for it (checked before writing; nothing is left).
        """
        tensors = dict(ckpt.params)
        tensors.update({MOMENTUM_PREFIX + k: v for k, v in ckpt.momentum.items()})
        digest = ckpt.computed_state_hash()
        meta = {
            "kind": "coordinator-checkpoint",
            "version": str(ckpt.version),
            "model_hash": ckpt.model_hash,
            "parent_hash": ckpt.parent_hash,
            "config_hash": ckpt.config_hash,
            "config_view": ckpt.config_view,
            "state_hash": digest,
        }
        if ckpt.record:
            meta["record"] = ckpt.record
        if self.signer is not None:
            meta["mac"] = self.signer.mac(digest)
            meta["mac_alg"] = self.signer.algorithm
            meta["mac_key_id"] = self.signer.key_id
        # Written piece by piece: no buffer of the checkpoint's size (parameters and momentum).
        parts = encode_parts(tensors, meta)
        self.folder.mkdir(parents=True, exist_ok=True)
        check_free_space(self.folder, sum(len(part) for part in parts))
        atomic_write(self.path(ckpt.version), parts)
        for old in self.versions()[:-KEEP]:
            if old in (self.pinned, self.kept):
                continue
            # No folder fsync: an old checkpoint a crash brings back is pruned by the next save
            # and never read before it (a resume loads the newest), so durability is unchanged
            # and the commit does not wait on one more disk flush.
            self.path(old).unlink(missing_ok=True)
        return digest

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
            IntegrityError: The file is corrupt, its name and contents disagree on its version,
                or its tensors do not hash to its model hash.
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
        require_momentum(path, set(params), set(momentum))
        require_recorded_version(path, version, recorded_version_of(meta))
        expected = meta.get("model_hash", "")
        actual = model_hash(params, version, meta.get("parent_hash", ""))
        if actual != expected:
            raise IntegrityError(
                f"checkpoint {path} does not match its recorded model hash (recorded {expected}, "
                f"recomputed {actual});",
                remediation="the file was modified; restore it or start a new run folder.",
            )
        ckpt = CoordinatorCheckpoint(
            version=version,
            params=params,
            momentum=momentum,
            model_hash=expected,
            parent_hash=meta.get("parent_hash", ""),
            config_hash=meta.get("config_hash", ""),
            config_view=meta.get("config_view", ""),
            record=meta.get("record", ""),
            state_hash=meta.get("state_hash", ""),
        )
        recomputed = ckpt.computed_state_hash()
        if recomputed != ckpt.state_hash:
            raise IntegrityError(
                f"checkpoint {path} does not match its recorded state hash (recorded "
                f"{ckpt.state_hash or '(none)'}, recomputed {recomputed}): its parameters, outer "
                "momentum or round record changed;",
                remediation="restore it from a backup or start a new run folder.",
            )
        if self.signer is not None and not self.signer.verify(recomputed, meta.get("mac", "")):
            raise mac_refusal(path, meta, self.signer)
        require_config_view(path, ckpt.config_hash, ckpt.config_view)
        return ckpt


class InnerStateStore:
    """A participant's inner-state snapshots, inside its own folder."""

    def __init__(self, output_dir: Path, participant_id: str) -> None:
        self.folder = output_dir / "participants" / participant_id / "state"

    def save(self, round_index: int, attempt: int, state: Mapping[str, torch.Tensor]) -> None:
        """Save the inner state after training ``(round_index, attempt)``.

        Snapshots of the three most recent rounds are kept: resuming before round ``t`` needs
        the last snapshot of round ``t - 1`` even when round ``t`` had several attempts, and
        even when this participant already trained round ``t + 1``, which the coordinator opens
        while round ``t``'s commit is still being written (a crash then redoes round ``t``).
        """
        path = self.path(round_index, attempt)
        parts = encode_parts(dict(state), {"kind": "inner-state"})
        self.folder.mkdir(parents=True, exist_ok=True)
        check_free_space(self.folder, sum(len(part) for part in parts))
        atomic_write(path, parts)
        rounds = sorted({e[0] for e in self._entries()})
        for old in self._entries():
            if old[0] < rounds[-3:][0]:
                # No folder fsync, as for coordinator checkpoints: a pruned snapshot a crash
                # brings back is older than the ones kept, and latest_before reads the newest.
                (self.folder / old[2]).unlink(missing_ok=True)

    def discard(self, round_index: int, attempt: int) -> None:
        """Delete the snapshot taken after training ``(round_index, attempt)``, if any."""
        self.path(round_index, attempt).unlink(missing_ok=True)

    def _entries(self) -> list[tuple[int, int, str]]:
        if not self.folder.is_dir():
            return []
        found = ((_INNER_FILE.match(p.name), p.name) for p in self.folder.iterdir())
        return sorted((int(m.group(1)), int(m.group(2)), name) for m, name in found if m)

    def path(self, round_index: int, attempt: int) -> Path:
        """The snapshot file taken after training ``(round_index, attempt)``."""
        return self.folder / f"inner-r{round_index:06d}-a{attempt:03d}.safetensors"

    def latest_before(
        self, round_index: int, attempt: int = 0
    ) -> tuple[tuple[int, int], dict[str, torch.Tensor]] | None:
        """The last snapshot taken before training ``(round_index, attempt)``, if any.

        Returns:
            ``((round, attempt), state)`` of that snapshot, or None.

        Raises:
            IntegrityError: The snapshot cannot be read or is not a safetensors file (names
                the file and the fix).
        """
        candidates = [e for e in self._entries() if (e[0], e[1]) < (round_index, attempt)]
        if not candidates:
            return None
        r, a, name = candidates[-1]
        path = self.folder / name
        try:
            return (r, a), decode(path.read_bytes()).tensors
        except (OSError, PayloadError) as exc:
            raise unusable_inner_state(path, str(exc)) from None


def unusable_inner_state(path: Path, why: str) -> IntegrityError:
    """The error for an inner-state snapshot that cannot be used: the file, why, and the fix."""
    return IntegrityError(
        f"the inner optimizer state {path} cannot be used ({why.rstrip('.')});",
        remediation=f"delete {path} (the participant then resumes from its previous snapshot, "
        f"or starts its inner state afresh when none is left: a different model than an "
        "uninterrupted run), or restore the file from a backup.",
    )
