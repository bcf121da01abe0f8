"""Which key a coordinator signs with, and which verified run record it resumes from.

A resume verifies the run folder once (:func:`~lensemble.federation.verify.require_valid`) and
hands the :class:`~lensemble.federation.verify.VerifiedRecord` on; the coordinator signs on with
the key that record was verified with, so a resumed run keeps one key from its first line on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from lensemble.config import LensembleConfig
from lensemble.errors import ConfigError
from lensemble.federation.signing import Signer, signer_from_env
from lensemble.federation.verify import VerifiedRecord, require_valid


def coordinator_signer(
    signer: Signer | Literal["env"] | None, resume: bool | VerifiedRecord, output_dir: Path | None
) -> Signer | None:
    """The key to sign with: the one given, else the verified record's, else the environment's."""
    if signer != "env":
        return signer
    if isinstance(resume, VerifiedRecord) and resume.signer is not None:
        return resume.signer
    return signer_from_env() if output_dir else None


def record_to_resume(
    resume: bool | VerifiedRecord, output_dir: Path, config: LensembleConfig, signer: Signer | None
) -> VerifiedRecord:
    """The verified run record to resume: the one handed over, or verified now.

    Raises:
        ConfigError: The record handed over was verified for another ledger or another key.
    """
    ledger_name = config.observability.ledger_path
    if not isinstance(resume, VerifiedRecord):
        return require_valid(output_dir, ledger_name, signer)  # before any work or write
    ledger_path = output_dir / ledger_name
    key = (signer.algorithm, signer.key_id) if signer else None
    checked = (resume.signer.algorithm, resume.signer.key_id) if resume.signer else None
    if resume.ledger_path != ledger_path or key != checked:
        raise ConfigError(
            f"the run record handed to the coordinator was verified for {resume.ledger_path} "
            f"with key {checked}, not for {ledger_path} with key {key}; verify the folder the "
            "coordinator writes, with the key it signs with."
        )
    return resume
