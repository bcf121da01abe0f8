"""Verify a run folder's record: the ledger's line chain, the model chain, checkpoints, MACs.

:func:`verify_run` is what ``lensemble verify`` prints. It reads only. Of several broken links
it reports the first in chain order: checkpoint v0, then ledger line 1, the checkpoint line 1
commits, line 2, and so on (:data:`~lensemble.federation.verify_report.Position`); the passes
are :mod:`~lensemble.federation.verify_chain` (lines) and
:mod:`~lensemble.federation.verify_checkpoints` (checkpoints).

:func:`require_valid` is what every resume (``simulate --resume``, the network coordinator,
``lensemble up``) runs once before any training or network I/O: it refuses a signing key that
does not fit the record (:func:`~lensemble.federation.record_keys.require_key_fits`), makes the
one repair a resume may make (a final ledger line torn or lost by a crash is rewritten from the
latest checkpoint's copy of that round's record when the two agree: the torn text is a prefix of
the line rebuilt from the checkpoint), and hands what it read and verified on as a
:class:`VerifiedRecord`, so nobody reads or checks the record again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from lensemble.errors import IntegrityError
from lensemble.federation.checkpoint_audit import AuditedCheckpoint, checkpoint_versions
from lensemble.federation.ledger import (
    Ledger,
    LedgerLine,
    ParsedLedger,
    RoundRecord,
    legacy_error,
    parse_ledger,
    parse_ledger_bytes,
)
from lensemble.federation.record_keys import Signature, require_key_fits, signature_of
from lensemble.federation.signing import Signer
from lensemble.federation.verify_chain import walk
from lensemble.federation.verify_checkpoints import Audit, audit_all, check_checkpoints
from lensemble.federation.verify_report import Break, BrokenLink, Repair, VerifyReport

__all__ = [
    "Break",
    "Repair",
    "VerifiedRecord",
    "VerifyReport",
    "broken_record",
    "require_valid",
    "verify_run",
]


def verify_run(
    run_dir: Path,
    ledger_name: str = "ledger.jsonl",
    signer: Signer | None = None,
) -> VerifyReport:
    """Walk a run folder's record and report the first broken link.

    Args:
        run_dir: The run folder (``run.output_dir``).
        ledger_name: The ledger path inside it (``observability.ledger_path``).
        signer: Checks every line's and checkpoint's MAC when given (a missing MAC is a break).

    Returns:
        The report; ``first_break`` is None when every line chains, every committed model
        chains, every checkpoint on disk matches its line, and every MAC checks. Otherwise it
        is the earliest broken link in chain order, whichever check found it.

    Raises:
        UsageError: The ledger is a version 1 ledger.
    """
    ledger_path = run_dir / ledger_name
    parsed = parse_ledger(ledger_path)
    if parsed.legacy:
        raise legacy_error(ledger_path)
    versions = checkpoint_versions(run_dir)
    signature = (
        signature_of(parsed, ledger_path, run_dir, versions)
        if signer is None and not _signed(parsed) and parsed.lines
        else None
    )
    audits = audit_all(run_dir, versions, signer)
    return _verify(run_dir, ledger_path, parsed, signer, audits=audits, signature=signature)


def _signed(parsed: ParsedLedger) -> int:
    return sum(isinstance(line.body.get("mac"), dict) for line in parsed.lines)


def _verify(
    run_dir: Path,
    ledger_path: Path,
    parsed: ParsedLedger,
    signer: Signer | None,
    *,
    audits: dict[int, Audit],
    signature: Signature | None,
) -> VerifyReport:
    """Both passes over a parsed ledger and audited checkpoints; the first break wins."""
    report = VerifyReport(str(run_dir), str(ledger_path), macs_checked=signer is not None)
    report.signed = _signed(parsed)
    breaks: list[BrokenLink] = []
    if signer is None and report.signed == 0 and parsed.lines and signature is not None:
        # A run is signed from its first round or not at all: signed checkpoints beside a
        # ledger without a MAC mean the ledger's MACs were removed (a key would catch it too).
        what = (
            f"carries no MAC, but {signature.where} is signed ({signature.algorithm}, key "
            f"{signature.key_id}): the ledger's MACs were removed"
        )
        breaks.append(BrokenLink(Break(str(ledger_path), 1, what)))
    try:
        walk(report, parsed, ledger_path, signer)
    except BrokenLink as exc:
        breaks.append(exc)
    breaks += check_checkpoints(
        report, parsed, audits, run_dir=run_dir, path=ledger_path, signer=signer, chained=not breaks
    )
    if breaks:
        report.first_break = min(breaks, key=lambda b: b.at).brk
        report.repair = None
    return report


@dataclass
class VerifiedRecord:
    """A run record :func:`require_valid` read and verified once, for whoever continues it.

    Attributes:
        run_dir: The run folder.
        ledger_path: Its ledger.
        signer: The key the record was verified with (None: unsigned); a resume signs with it.
        signature: The record's first MAC, or None when it carries none.
        report: The verification's report (no break; any crash repair already applied).
        lines: The ledger's lines after any repair, parsed.
        raw: The ledger's bytes after any repair (kept beside a later rewrite).
        latest: The newest checkpoint, audited, with its tensors until :meth:`take_latest`;
            None when there is no checkpoint.
    """

    run_dir: Path
    ledger_path: Path
    signer: Signer | None
    signature: Signature | None
    report: VerifyReport
    lines: list[LedgerLine]
    raw: bytes
    latest: AuditedCheckpoint | None

    def records(self) -> list[RoundRecord]:
        """Every line's round record, in order."""
        return [line.record for line in self.lines]

    def take_latest(self) -> AuditedCheckpoint | None:
        """The newest checkpoint with its tensors; this record keeps it without them after.

        The tensors (numpy arrays, parameters and ``momentum::`` entries) are a whole model and
        its momentum: the taker holds the only reference, so they go once copied.
        """
        latest = self.latest
        if latest is not None:
            self.latest = replace(latest, tensors=None)
        return latest


def require_valid(
    run_dir: Path, ledger_name: str, signer: Signer | None, *, keep_tensors: bool = True
) -> VerifiedRecord:
    """Verify once before any work: apply a pending crash repair, or refuse with the broken link.

    The ledger is read once and every checkpoint audited once; the repaired ledger is checked
    again in memory against those audits. Checks first that ``signer`` fits the record
    (:func:`~lensemble.federation.record_keys.require_key_fits`). Writes only to apply a repair
    (after checking there is room).

    Args:
        run_dir: The run folder.
        ledger_name: The ledger inside it.
        signer: The key the resume signs with (None: unsigned).
        keep_tensors: Keep the newest checkpoint's tensors for the resume (False: a process
            that only checks the record before another one resumes it).

    Returns:
        What was read and verified, handed to the resume.

    Raises:
        IntegrityError: The record is broken (names the line and both hashes; exit 3), or a
            key is configured for a record without any MAC.
        UsageError: The ledger is a version 1 ledger, or the record is signed and no key is
            configured (exit 2).
        DiskFull: No room to apply the repair.
    """
    ledger_path = run_dir / ledger_name
    parsed = parse_ledger(ledger_path)
    if parsed.legacy:
        raise legacy_error(ledger_path)
    versions = checkpoint_versions(run_dir)
    signature = signature_of(parsed, ledger_path, run_dir, versions)
    has_record = bool(parsed.lines) or bool(versions)
    require_key_fits(ledger_path, signature, signer, has_record=has_record)
    audits = audit_all(run_dir, versions, signer, keep_latest=keep_tensors)
    report = _verify(run_dir, ledger_path, parsed, signer, audits=audits, signature=signature)
    if report.first_break is None and report.repair is not None:
        parsed = _apply_repair(ledger_path, parsed, report.repair)
        report = _verify(run_dir, ledger_path, parsed, signer, audits=audits, signature=signature)
    if report.first_break is not None:
        raise broken_record(run_dir, report.first_break)
    latest = audits[versions[-1]] if versions else None
    assert latest is None or isinstance(latest, AuditedCheckpoint)  # no break: every one passed
    return VerifiedRecord(
        run_dir, ledger_path, signer, signature, report, parsed.lines, parsed.raw, latest
    )


def _apply_repair(ledger_path: Path, parsed: ParsedLedger, repair: Repair) -> ParsedLedger:
    """Rewrite the ledger as ``repair`` says; returns the new contents, parsed in memory."""
    Ledger(ledger_path).rewrite_texts(repair.texts, why=repair.reason, old=parsed.raw)
    return parse_ledger_bytes("".join(text + "\n" for text in repair.texts).encode())


def broken_record(run_dir: Path, first_break: Break) -> IntegrityError:
    """The error that refuses work on a broken run record (exit 3), naming its first break."""
    return IntegrityError(
        f"the run record in {run_dir} is broken at {first_break.sentence()};",
        remediation="nothing was trained; restore the folder from a backup, or start a new "
        "run folder (`lensemble verify` prints the same).",
    )
