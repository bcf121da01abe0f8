"""Check a coordinator checkpoint without torch, so ``lensemble verify`` starts in a blink.

The same checks as :meth:`lensemble.federation.checkpoint.CheckpointStore.load` (model hash,
momentum present, state hash, MAC), computed with numpy over the tensors safetensors reads. The
digests are byte for byte those of :func:`lensemble.federation.payload.tensor_digest` and
:func:`lensemble.federation.checkpoint.state_hash` (a test compares them on real checkpoints).
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lensemble.errors import IntegrityError
from lensemble.federation.signing import Signer

MOMENTUM_PREFIX = "momentum::"
MODEL_HASH_DOMAIN = b"lensemble/global-model/v1\x00"
STATE_DOMAIN = b"lensemble/coordinator-state/v1\x00"
PAYLOAD_FORMAT = "lensemble-payload-v1"
#: :data:`lensemble.config.hashing.HASH_ALGORITHM`, the config hash's algorithm id (not imported:
#: verification starts without the config schema).
CONFIG_HASH_ALGORITHM = "sha256-canon-v1"
MODEL_FILE = re.compile(r"^model-v(\d{6})\.safetensors$")
_TOKENS = {"float32": "F32", "float16": "F16", "float64": "F64", "int8": "I8", "int32": "I32"}
_TOKENS.update({"int64": "I64", "uint8": "U8"})
#: Largest safetensors header :func:`checkpoint_metadata` reads (bytes); checkpoints' are KBs.
MAX_HEADER_BYTES = 100 * 2**20


@dataclass(frozen=True)
class AuditedCheckpoint:
    """What verification needs of a checkpoint that passed every check.

    Attributes:
        version: Model version.
        model_hash: Its model hash (recomputed and equal).
        parent_hash: The parent model's hash.
        record: Canonical JSON of the round record it commits (``""`` for v0).
        state_hash: Its state hash (recomputed and equal).
        config_hash: The config hash it records.
        config_view: The hashed config it records, as canonical JSON (``""`` when absent).
        tensors: Name -> numpy array of every tensor (parameters, and the outer momentum
            under ``momentum::<name>``) when asked to keep them, else None.
    """

    version: int
    model_hash: str
    parent_hash: str
    record: str
    state_hash: str
    config_hash: str = ""
    config_view: str = ""
    tensors: dict[str, Any] | None = field(default=None, repr=False, compare=False)


class HashMismatch(IntegrityError):
    """A checkpoint's tensors do not hash to the hash it records (exit 3).

    Attributes:
        what: What does not hold, without the file (e.g. ``does not match its recorded model
            hash``).
        recorded: The hash the file records (full).
        recomputed: The hash of its contents (full).
    """

    def __init__(
        self, path: Path, what: str, recorded: str, recomputed: str, *, remediation: str
    ) -> None:
        super().__init__(
            f"checkpoint {path} {what} (recorded {recorded}, recomputed {recomputed});",
            remediation=remediation,
        )
        self.what, self.recorded, self.recomputed = what, recorded, recomputed


def checkpoint_folder(run_dir: Path) -> Path:
    """``<run_dir>/coordinator/checkpoints``."""
    return run_dir / "coordinator" / "checkpoints"


def checkpoint_path(run_dir: Path, version: int) -> Path:
    """Where checkpoint ``version`` lives."""
    return checkpoint_folder(run_dir) / f"model-v{version:06d}.safetensors"


def checkpoint_versions(run_dir: Path) -> list[int]:
    """Versions with a checkpoint on disk, ascending."""
    folder = checkpoint_folder(run_dir)
    if not folder.is_dir():
        return []
    found = (MODEL_FILE.match(p.name) for p in folder.iterdir())
    return sorted(int(m.group(1)) for m in found if m)


def _digest(tensors: dict[str, Any], suffix: bytes) -> str:
    h = hashlib.sha256(MODEL_HASH_DOMAIN)
    for name in sorted(tensors):
        array = tensors[name]
        encoded = name.encode()
        token = _TOKENS[str(array.dtype)].encode()
        h.update(struct.pack("<I", len(encoded)) + encoded)
        h.update(struct.pack("<B", len(token)) + token)
        h.update(
            struct.pack("<I", array.ndim) + b"".join(struct.pack("<Q", d) for d in array.shape)
        )
        h.update(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes(order="C"))
    h.update(suffix)
    return h.hexdigest()


def _state_suffix(version: int, *texts: str) -> bytes:
    suffix = STATE_DOMAIN + struct.pack("<Q", version)
    for text in texts:
        encoded = text.encode()
        suffix += struct.pack("<Q", len(encoded)) + encoded
    return suffix


def audit_checkpoint(
    path: Path, version: int, signer: Signer | None, *, keep_tensors: bool = False
) -> AuditedCheckpoint:
    """Read checkpoint ``version`` and check it like ``CheckpointStore.load`` does.

    Args:
        path: The checkpoint file.
        version: The version its name says.
        signer: Checks its MAC when given.
        keep_tensors: Return its tensors too (a resume continues from them).

    Raises:
        IntegrityError: Unreadable, momentum missing, a hash that does not recompute, or a MAC
            that does not verify (the messages are ``CheckpointStore.load``'s).
    """
    meta, tensors = _read(path)
    params = {k: v for k, v in tensors.items() if not k.startswith(MOMENTUM_PREFIX)}
    momentum = {k: v for k, v in tensors.items() if k.startswith(MOMENTUM_PREFIX)}
    require_momentum(path, set(params), {k.removeprefix(MOMENTUM_PREFIX) for k in momentum})
    recorded_version = recorded_version_of(meta)
    require_recorded_version(path, version, recorded_version)
    expected = meta.get("model_hash", "")
    parent = meta.get("parent_hash", "")
    suffix = struct.pack("<Q", recorded_version) + parent.encode()
    actual = "sha256:" + _digest(params, suffix)
    if actual != expected:
        raise HashMismatch(
            path,
            "does not match its recorded model hash",
            expected,
            actual,
            remediation="the file was modified; restore it or start a new run folder.",
        )
    record = meta.get("record", "")
    recorded_state = meta.get("state_hash", "")
    suffix = _state_suffix(version, expected, parent, meta.get("config_hash", ""), record)
    recomputed = "sha256:" + _digest(dict(tensors), suffix)
    if recomputed != recorded_state:
        raise HashMismatch(
            path,
            "does not match its recorded state hash (its parameters, outer momentum or round "
            "record changed)",
            recorded_state or "(none)",
            recomputed,
            remediation="restore it from a backup or start a new run folder.",
        )
    if signer is not None and not signer.verify(recomputed, meta.get("mac", "")):
        raise mac_refusal(path, meta, signer)
    require_config_view(path, meta.get("config_hash", ""), meta.get("config_view", ""))
    return AuditedCheckpoint(
        version,
        expected,
        parent,
        record,
        recorded_state,
        meta.get("config_hash", ""),
        meta.get("config_view", ""),
        dict(tensors) if keep_tensors else None,
    )


def _read(path: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """A checkpoint's metadata and tensors (numpy arrays), read without torch.

    Raises:
        IntegrityError: The file cannot be read, is not safetensors, or has another format.
    """
    from safetensors import SafetensorError
    from safetensors.numpy import load as np_load

    try:
        data = path.read_bytes()
        (header_len,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + header_len])
        meta = {str(k): str(v) for k, v in (header.get("__metadata__") or {}).items()}
        if meta.get("format") != PAYLOAD_FORMAT:
            raise ValueError(f"format {meta.get('format')!r}, expected {PAYLOAD_FORMAT!r}")
        return meta, np_load(data)
    except (
        OSError,
        SafetensorError,
        ValueError,
        KeyError,
        AttributeError,  # a header that is JSON but not an object
        RecursionError,  # a header nested deeper than the JSON parser goes
        struct.error,
    ) as exc:
        raise IntegrityError(
            f"checkpoint {path} cannot be read ({exc});",
            remediation="delete it to resume from the previous checkpoint.",
        ) from None


def mac_refusal(path: Path, meta: dict[str, str], signer: Signer) -> IntegrityError:
    """Why checkpoint ``path``'s MAC does not verify with ``signer``, naming both keys.

    A key other than the one the checkpoint names (a wrong ``--key-file``) is told apart from
    a MAC that the right key does not verify (a checkpoint written without the key).

    Args:
        path: The checkpoint file.
        meta: Its safetensors metadata (``mac``, ``mac_alg``, ``mac_key_id``).
        signer: The key supplied.
    """
    recorded = meta.get("mac_key_id", "")[:200]
    if not meta.get("mac"):
        return IntegrityError(
            f"checkpoint {path} carries no MAC, but a key is given ({signer.algorithm}, key "
            f"{signer.key_id});",
            remediation="it was written without a key: restore it from a backup or start a new "
            "run folder.",
        )
    if recorded and recorded != signer.key_id:
        return IntegrityError(
            f"checkpoint {path} is signed with key {recorded} "
            f"({meta.get('mac_alg', '')[:40] or 'unknown algorithm'}), not with the key given "
            f"({signer.algorithm}, key {signer.key_id});",
            remediation=f"pass the key whose fingerprint is {recorded} (--key-file, or "
            "LENSEMBLE_LEDGER_KEY_FILE).",
        )
    return IntegrityError(
        f"checkpoint {path} has a MAC that does not verify with key {signer.key_id}, the key "
        "it names;",
        remediation="it was written by someone without the key: restore it from a backup or "
        "start a new run folder.",
    )


def require_momentum(path: Path, params: set[str], momentum: set[str]) -> None:
    """Refuse a checkpoint whose outer-momentum tensors do not match its parameters one to one.

    Args:
        path: The checkpoint (named in the error).
        params: Parameter names.
        momentum: Momentum tensor names with their prefix removed.

    Raises:
        IntegrityError: A parameter lacks its momentum, or a momentum its parameter.
    """
    missing = sorted(params ^ momentum)
    if missing:
        raise IntegrityError(
            f"checkpoint {path} lacks the outer momentum of {len(missing)} tensors "
            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''});",
            remediation="the file was modified; restore it or start a new run folder.",
        )


def require_config_view(path: Path, config_hash: str, config_view: str) -> None:
    """Refuse a checkpoint whose recorded config view is not the config its state hash names.

    The state hash (and its MAC) covers the config hash, not the view; the view is what a
    resume compares its own config with (only ``federation.rounds`` may differ), so it must be
    the config the hash names: ``config_hash`` is SHA-256 of exactly these canonical JSON
    bytes (:func:`lensemble.config.hashing.config_hash`). An empty view (none recorded) is
    no claim: a resume then needs the very same config hash.

    Args:
        path: The checkpoint (named in the error).
        config_hash: The config hash it records (``sha256-canon-v1:<64 hex>``).
        config_view: The config view it records, canonical JSON.

    Raises:
        HashMismatch: The view does not hash to the config hash (the view was edited).
    """
    if not config_view:
        return
    recomputed = f"{CONFIG_HASH_ALGORITHM}:{hashlib.sha256(config_view.encode()).hexdigest()}"
    if recomputed != config_hash:
        raise HashMismatch(
            path,
            "records a config view that does not hash to its recorded config hash (the config "
            "a resume would be checked against was edited)",
            config_hash or "(none)",
            recomputed,
            remediation="restore the checkpoint from a backup or start a new run folder.",
        )


def require_recorded_version(path: Path, version: int, recorded: int) -> None:
    """Refuse a checkpoint whose file name and contents disagree on its model version.

    A checkpoint renamed or copied over another version's name hashes to its own recorded
    model hash, so the hash comparison alone would print two identical hashes; this names the
    real cause.

    Args:
        path: The checkpoint (named in the error).
        version: The version its file name says (``model-v<version>.safetensors``).
        recorded: The version its metadata records (-1 when absent or not an integer).

    Raises:
        IntegrityError: The two differ.
    """
    if recorded == version:
        return
    if recorded < 0:
        raise IntegrityError(
            f"checkpoint {path} is named version {version}, but its contents record no model "
            "version;",
            remediation="the file was modified; restore it from a backup or start a new run "
            "folder.",
        )
    raise IntegrityError(
        f"checkpoint {path} is named version {version}, but its contents record version "
        f"{recorded} (the file was renamed or copied over another version's name);",
        remediation=f"rename it back to model-v{recorded:06d}.safetensors, or restore the "
        "folder from a backup.",
    )


def checkpoint_metadata(path: Path) -> dict[str, str]:
    """A checkpoint's safetensors metadata, read from its header alone (no tensor is read).

    Returns:
        The metadata, or an empty dict when the file cannot be read or has no valid header
        (verification names that file's problem).
    """
    try:
        with path.open("rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            if header_len > MAX_HEADER_BYTES:
                return {}
            header = json.loads(f.read(header_len))
        return {str(k): str(v) for k, v in (header.get("__metadata__") or {}).items()}
    except (OSError, ValueError, AttributeError, RecursionError, struct.error):
        return {}


def recorded_version_of(meta: dict[str, str]) -> int:
    """The model version a checkpoint's metadata records; -1 when absent or not an integer."""
    try:
        return int(meta.get("version", "-1"))
    except ValueError:
        return -1
