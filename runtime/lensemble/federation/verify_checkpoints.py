"""The checkpoint pass of verification: every checkpoint on disk against the line it commits.

Each checkpoint is audited once (:func:`audit_all`: readable, momentum present, model hash,
state hash, MAC; :func:`lensemble.federation.checkpoint_audit.audit_checkpoint`), then matched
to the committed ledger line naming it (:func:`check_checkpoints`). Only the latest checkpoint,
one version past the ledger's last commit, may restore a final line a crash tore or lost
(:class:`~lensemble.federation.verify_report.Repair`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lensemble.errors import IntegrityError
from lensemble.federation.checkpoint_audit import (
    AuditedCheckpoint,
    HashMismatch,
    audit_checkpoint,
    checkpoint_folder,
    checkpoint_path,
)
from lensemble.federation.ledger import (
    LedgerLine,
    ParsedLedger,
    RoundRecord,
    build_line,
    canonical,
    record_from_dict,
)
from lensemble.federation.signing import Signer
from lensemble.federation.verify_report import Break, BrokenLink, Position, Repair, VerifyReport

#: A checkpoint's audit: what passed every check, or the error that failed it.
Audit = AuditedCheckpoint | IntegrityError


def audit_all(
    run_dir: Path, versions: list[int], signer: Signer | None, *, keep_latest: bool = False
) -> dict[int, Audit]:
    """Audit every checkpoint in ``versions`` once.

    Args:
        run_dir: The run folder.
        versions: The checkpoint versions on disk, ascending.
        signer: Checks each checkpoint's MAC when given.
        keep_latest: Keep the latest checkpoint's tensors (a resume continues from them).

    Returns:
        Version -> its audit (never raises for a broken checkpoint).
    """
    audits: dict[int, Audit] = {}
    for version in versions:
        keep = keep_latest and version == versions[-1]
        try:
            audits[version] = audit_checkpoint(
                checkpoint_path(run_dir, version), version, signer, keep_tensors=keep
            )
        except IntegrityError as exc:
            audits[version] = exc
    return audits


@dataclass(frozen=True)
class _Pass:
    """What the checkpoint pass reads: the record, where it lives, and the audits."""

    report: VerifyReport
    parsed: ParsedLedger
    run_dir: Path
    path: Path
    signer: Signer | None
    audits: dict[int, Audit]


def check_checkpoints(
    report: VerifyReport,
    parsed: ParsedLedger,
    audits: dict[int, Audit],
    *,
    run_dir: Path,
    path: Path,
    signer: Signer | None,
    chained: bool,
) -> list[BrokenLink]:
    """Check every audited checkpoint against its line; returns every broken link found.

    Each checkpoint is checked on its own, so a broken one does not hide an earlier one; the
    caller keeps the earliest in chain order. ``chained`` says the ledger walk found no break
    (only then can a torn or lost final line be restored from the latest checkpoint).
    """
    run = _Pass(report, parsed, run_dir, path, signer, audits)
    committed = _committed_lines(parsed)
    versions = sorted(audits)
    last_version = max(committed, default=0)
    breaks: list[BrokenLink] = []
    for version in versions:
        line = committed.get(version)
        # Only the latest checkpoint, one version past the ledger, may restore a lost line.
        tail = chained and version == last_version + 1 == versions[-1]
        try:
            _one_checkpoint(run, version, line, tail=tail)
        except BrokenLink as exc:
            if not exc.placed:
                exc.at = _position(version, line, len(parsed.lines) + 1)
            breaks.append(exc)
    breaks += _torn_tail(run, versions, last_version, breaks)
    last_line = committed[last_version].number if committed else 0
    breaks += _missing(run_dir, versions, last_version, last_line)
    return breaks


def _committed_lines(parsed: ParsedLedger) -> dict[int, LedgerLine]:
    """Model version -> the first committed line that claims it."""
    committed: dict[int, LedgerLine] = {}
    for entry in parsed.lines:
        record = record_or_none(entry)
        if record is not None and record.state == "closed":
            committed.setdefault(record.round + 1, entry)
    return committed


def _position(version: int, line: LedgerLine | None, beyond: int) -> Position:
    if version == 0:
        return (0, 1)
    return (line.number, 1) if line else (beyond, 1)


def _torn_tail(
    run: _Pass, versions: list[int], last_version: int, breaks: list[BrokenLink]
) -> list[BrokenLink]:
    """A torn final line: dropped when it is an attempt after the latest checkpoint."""
    parsed, report = run.parsed, run.report
    if parsed.torn is None or report.repair is not None:
        return []
    beyond = len(parsed.lines) + 1  # where the torn line is
    if versions and versions[-1] == last_version:
        # The torn line is an attempt after the latest checkpoint: a resume redoes it.
        report.repair = Repair(
            [line.text for line in parsed.lines],
            f"drops the final line {beyond}, torn by a crash (an attempt the resume redoes)",
        )
        return []
    if any(b.at == (beyond, 0) for b in breaks):  # named by the checkpoint loop already
        return []
    return [
        BrokenLink(
            Break(
                str(run.path),
                beyond,
                "is torn and no checkpoint holds its record",
                "a complete line",
                parsed.torn[:80],
            )
        )
    ]


def _missing(
    run_dir: Path, versions: list[int], last_version: int, last_line: int
) -> list[BrokenLink]:
    """The checkpoint of the last committed round is not on disk."""
    if last_version and not versions:
        found = "none"
        what = "holds no checkpoint, but the ledger commits rounds"
    elif versions and versions[-1] < last_version:
        found = f"model-v{versions[-1]:06d}.safetensors"
        what = "lacks the checkpoint of the last committed round"
    else:
        return []
    expected = f"model-v{last_version:06d}.safetensors"
    folder = str(checkpoint_folder(run_dir))
    return [BrokenLink(Break(folder, None, what, expected, found), (last_line, 1))]


def _audited(audit: Audit, ckpt_path: Path, line: LedgerLine | None) -> AuditedCheckpoint:
    """The audit's checkpoint, or the break its error names."""
    if isinstance(audit, AuditedCheckpoint):
        return audit
    # The break names the file already: "<file>: is named version 6, but ...".
    if isinstance(audit, HashMismatch):  # both hashes as fields, as a ledger break has them
        of_line = f" (it is the checkpoint of ledger line {line.number})" if line else ""
        raise BrokenLink(
            Break(str(ckpt_path), None, audit.what + of_line, audit.recorded, audit.recomputed)
        )
    what = audit.message.rstrip(";").removeprefix(f"checkpoint {ckpt_path} ")
    raise BrokenLink(Break(str(ckpt_path), None, what))


def _one_checkpoint(run: _Pass, version: int, line: LedgerLine | None, *, tail: bool) -> None:
    """Check checkpoint ``version`` against ``line``, the committed line naming it (if any).

    ``tail``: the checkpoint is the latest, one version past the ledger's last committed round,
    so its record may restore a final line a crash tore or lost (sets ``report.repair``).
    """
    ckpt_path = checkpoint_path(run.run_dir, version)
    ckpt = _audited(run.audits[version], ckpt_path, line)
    run.report.checkpoints.append(version)
    if version == 0:
        _check_first(run.parsed, ckpt, ckpt_path)
        return
    if line is not None:
        _match(line, ckpt, ckpt_path, run.path)
        return
    if tail:
        run.report.repair = _tail_repair(run.parsed, ckpt, run.signer)
        if run.report.repair is not None:
            run.report.model_hash = ckpt.model_hash
            return
    if run.parsed.torn is not None:
        beyond = len(run.parsed.lines) + 1
        raise BrokenLink(
            Break(
                str(run.path),
                beyond,
                f"is torn and does not agree with checkpoint v{version}'s copy of round "
                f"{version - 1}",
                "a prefix of the checkpoint's line",
                run.parsed.torn[:80],
            ),
            (beyond, 0),
        )
    raise BrokenLink(
        Break(
            str(ckpt_path),
            None,
            f"commits round {version - 1}, which the ledger does not record",
            "a committed ledger line",
            "none",
        )
    )


def _check_first(parsed: ParsedLedger, ckpt: AuditedCheckpoint, ckpt_path: Path) -> None:
    """Checkpoint v0 holds the model line 1 starts from."""
    first = record_or_none(parsed.lines[0]) if parsed.lines else None
    start = first.parent_hash if first is not None else ckpt.model_hash
    if ckpt.model_hash != start:
        raise BrokenLink(
            Break(
                str(ckpt_path), None, "is not the model line 1 starts from", start, ckpt.model_hash
            )
        )


def record_or_none(line: LedgerLine) -> RoundRecord | None:
    """The line's round record, or None when it has none (the ledger walk names that line)."""
    try:
        return line.record
    except IntegrityError:
        return None


def _match(line: LedgerLine, ckpt: AuditedCheckpoint, ckpt_path: Path, path: Path) -> None:
    recorded = line.body.get("checkpoint")
    if recorded != ckpt.state_hash:
        raise BrokenLink(
            Break(
                str(path),
                line.number,
                f"does not record checkpoint {ckpt_path.name}'s state "
                "(parameters, momentum and round record)",
                ckpt.state_hash,
                str(recorded),
            )
        )
    found = canonical(line.body.get("record"))
    if ckpt.record != found:
        # The checkpoint's copy is bound by the state hash the line names (checked above), so
        # it is the line's record that changed, with its line hash recomputed.
        raise BrokenLink(
            Break(
                str(path),
                line.number,
                f"holds another round record than the copy in {ckpt_path.name}, which it "
                "commits (hashes of the two records)",
                _text_hash(ckpt.record),
                _text_hash(found),
            )
        )
    if ckpt.model_hash != line.record.model_hash:
        raise BrokenLink(
            Break(
                str(path),
                line.number,
                f"names another model than {ckpt_path.name}",
                ckpt.model_hash,
                line.record.model_hash,
            )
        )


def _text_hash(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _tail_repair(
    parsed: ParsedLedger, ckpt: AuditedCheckpoint, signer: Signer | None
) -> Repair | None:
    """The repair restoring the latest checkpoint's line, if the ledger's tail agrees with it."""
    if not ckpt.record:
        return None
    good = list(parsed.lines)
    try:  # bound by the state hash, yet an unsigned record's forger can write anything there
        record: dict[str, Any] = json.loads(ckpt.record)
        record_from_dict(record, f"checkpoint v{ckpt.version}'s record")
    except (ValueError, RecursionError, IntegrityError):
        return None
    signed = any(isinstance(line.body.get("mac"), dict) for line in good)
    if signed and signer is None:
        return None
    prev = good[-1].line_hash if good else ""
    text = build_line(len(good) + 1, prev, record, ckpt.state_hash, signer)
    if good and record.get("parent_hash") != _last_model(good):
        return None
    if parsed.torn is not None:
        if not text.startswith(parsed.torn):
            return None
        why = f"restores line {len(good) + 1}, torn by a crash, from checkpoint v{ckpt.version}"
    else:
        why = f"restores line {len(good) + 1}, lost in a crash, from checkpoint v{ckpt.version}"
    return Repair([line.text for line in good] + [text], why)


def _last_model(lines: list[LedgerLine]) -> str:
    model = lines[0].record.parent_hash
    for line in lines:
        if line.record.state == "closed":
            model = line.record.model_hash
    return model
