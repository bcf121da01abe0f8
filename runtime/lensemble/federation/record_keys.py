"""Which key signed a run record, and whether the key of this process fits it.

A run is signed from its first round or not at all (docs/run-record.md): a resume without the
key of a signed record, or with a key for a record that carries no MAC, is refused before any
work (:func:`require_key_fits`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lensemble.errors import IntegrityError, UsageError
from lensemble.federation.checkpoint_audit import (
    checkpoint_metadata,
    checkpoint_path,
    checkpoint_versions,
)
from lensemble.federation.ledger import ParsedLedger, parse_ledger
from lensemble.federation.signing import KEY_ENV, KEY_FILE_ENV, KMS_KEY_ENV, KmsSigner, Signer


@dataclass(frozen=True)
class Signature:
    """The first MAC a run record carries: what signed it, and where it was found.

    Attributes:
        algorithm: ``hmac-sha256`` or ``kms-hmac-sha256``.
        key_id: The key's id (an HMAC key's fingerprint, or a KMS key's ARN or alias).
        where: The file carrying it (the ledger, or a checkpoint when no line is signed).
    """

    algorithm: str
    key_id: str
    where: str


def record_signature(run_dir: Path, ledger_name: str = "ledger.jsonl") -> Signature | None:
    """The first MAC of a run record, from its ledger lines, else its checkpoints' headers.

    Reads only the ledger and each checkpoint's header (no tensor), and judges nothing:
    :func:`lensemble.federation.verify.verify_run` checks every MAC when given the key.

    Returns:
        The signature found, or None when neither a line nor a checkpoint carries a MAC.
    """
    ledger_path = run_dir / ledger_name
    return signature_of(parse_ledger(ledger_path), ledger_path, run_dir)


def signature_of(
    parsed: ParsedLedger, ledger_path: Path, run_dir: Path, versions: list[int] | None = None
) -> Signature | None:
    """:func:`record_signature` of a ledger already parsed (``versions``: checkpoints on disk)."""
    for line in parsed.lines:
        mac = line.body.get("mac")
        if isinstance(mac, dict):
            return Signature(
                str(mac.get("alg", ""))[:40], str(mac.get("key_id", ""))[:200], str(ledger_path)
            )
    for version in checkpoint_versions(run_dir) if versions is None else versions:
        ckpt_path = checkpoint_path(run_dir, version)
        meta = checkpoint_metadata(ckpt_path)
        if meta.get("mac"):
            return Signature(
                meta.get("mac_alg", "")[:40], meta.get("mac_key_id", "")[:200], str(ckpt_path)
            )
    return None


def require_matching_key(run_dir: Path, ledger_name: str, signer: Signer | None) -> None:
    """Refuse to continue a run record with a signing key that does not fit it.

    Reads the ledger and the checkpoints' headers, then applies :func:`require_key_fits`.

    Args:
        run_dir: The run folder.
        ledger_name: The ledger inside it.
        signer: The key this process signs with (None: unsigned).

    Raises:
        UsageError: The record is signed and no key is configured (exit 2).
        IntegrityError: A key is configured and the record carries no MAC at all (exit 3).
    """
    ledger_path = run_dir / ledger_name
    parsed = parse_ledger(ledger_path)
    versions = checkpoint_versions(run_dir)
    signature = signature_of(parsed, ledger_path, run_dir, versions)
    has_record = bool(parsed.lines) or bool(versions)
    require_key_fits(ledger_path, signature, signer, has_record=has_record)


def require_key_fits(
    ledger_path: Path, signature: Signature | None, signer: Signer | None, *, has_record: bool
) -> None:
    """Refuse a key that does not fit a record whose first MAC is ``signature``.

    A resume without the key of a signed record would append lines and checkpoints without a
    MAC, which no later ``lensemble verify --key-file`` accepts; a key for a record without any
    MAC cannot tell a run that was never signed from one whose MACs were stripped, and would
    leave the record half signed. Both are refused before any work (docs/run-record.md).

    Args:
        ledger_path: The run's ledger (named in the error).
        signature: The record's first MAC (:func:`signature_of`), or None.
        signer: The key this process signs with (None: unsigned).
        has_record: The record holds ledger lines or checkpoints.

    Raises:
        UsageError: The record is signed and no key is configured (exit 2; names the ledger
            and the environment variable to set).
        IntegrityError: A key is configured and the record, which holds lines or
            checkpoints, carries no MAC at all (exit 3).
    """
    if signer is None and signature is not None:
        if signature.algorithm == KmsSigner.algorithm:
            how = f"set {KMS_KEY_ENV}={signature.key_id}"
        else:
            how = f"set {KEY_FILE_ENV} to the run's key file (or {KEY_ENV} to the key in hex)"
        raise UsageError(
            f"the run record {signature.where} is signed ({signature.algorithm}, key "
            f"{signature.key_id}) but no signing key is configured, so resuming would write "
            "lines and checkpoints without a MAC;",
            remediation=f"{how} and run the same command again; nothing was trained or written.",
        )
    if signer is not None and signature is None and has_record:
        raise IntegrityError(
            f"the run record {ledger_path} carries no MAC, but a signing key is configured "
            f"({signer.algorithm}, key {signer.key_id}): either the run was never signed or "
            "its MACs were removed;",
            remediation=f"if it was started without a key, resume it with {KEY_FILE_ENV}, "
            f"{KEY_ENV} and {KMS_KEY_ENV} unset (a run is signed from its first round or not at "
            "all); if it was signed, restore the folder from a backup.",
        )
