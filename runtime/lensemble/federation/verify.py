"""Verify a run folder's record: the ledger's line chain, the model chain, checkpoints, MACs.

:func:`verify_run` is what ``lensemble verify`` prints and what every resume (``simulate
--resume``, the network coordinator, ``lensemble up``) runs before any training or network I/O.
It reads only. Of several broken links it reports the first in chain order: checkpoint v0, then
ledger line 1, the checkpoint line 1 commits, line 2, and so on (:data:`Position`).
:func:`require_valid` makes the one repair a resume may make: a final ledger line torn or lost by
a crash is rewritten from the latest checkpoint's copy of that round's record when the two agree
(the torn text is a prefix of the line rebuilt from the checkpoint). It also refuses a resume
whose signing key does not fit the record (:func:`require_matching_key`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lensemble.errors import IntegrityError, UsageError
from lensemble.federation.checkpoint_audit import (
    AuditedCheckpoint,
    HashMismatch,
    audit_checkpoint,
    checkpoint_folder,
    checkpoint_metadata,
    checkpoint_path,
    checkpoint_versions,
)
from lensemble.federation.ledger import (
    LEDGER_FORMAT,
    LedgerLine,
    ParsedLedger,
    RoundRecord,
    build_line,
    canonical,
    legacy_error,
    line_digest,
    parse_ledger,
)
from lensemble.federation.signing import KEY_ENV, KEY_FILE_ENV, KMS_KEY_ENV, KmsSigner, Signer

#: Where a link sits in chain order: ``(ledger line, 0)`` for the line itself, ``(ledger line,
#: 1)`` for the checkpoint that line commits (``(0, 1)`` for v0, before line 1).
Position = tuple[int, int]


@dataclass(frozen=True)
class Break:
    """The first broken link of a run record.

    Attributes:
        file: The file holding it (the ledger or a checkpoint).
        line: 1-based ledger line number, or None for a checkpoint.
        what: One sentence: what does not hold.
        expected: The full value the chain requires (a hash, usually).
        found: The full value found.
    """

    file: str
    line: int | None
    what: str
    expected: str = ""
    found: str = ""

    def sentence(self) -> str:
        """``file:line: what (expected X, found Y)`` on one line."""
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        values = f" (expected {self.expected}, found {self.found})" if self.expected else ""
        return f"{where}: {self.what}{values}"


@dataclass(frozen=True)
class Repair:
    """How a crash-torn or lost final ledger line is restored from the latest checkpoint.

    Attributes:
        texts: The ledger's complete new contents, line by line.
        reason: One sentence saying what is repaired.
    """

    texts: list[str]
    reason: str


@dataclass
class VerifyReport:
    """The outcome of :func:`verify_run`.

    Attributes:
        run_dir: The folder verified.
        ledger: The ledger file.
        lines: Ledger lines read.
        committed: Committed rounds in the ledger.
        checkpoints: Checkpoint versions checked.
        signed: Lines carrying a MAC.
        macs_checked: Whether MACs were checked (a key was given).
        model_hash: The last committed model hash ("" when none).
        first_break: The first broken link, or None when the record holds.
        repair: A crash-torn tail a resume restores from the checkpoint (the record is valid
            once it is applied), or None.
    """

    run_dir: str
    ledger: str
    lines: int = 0
    committed: int = 0
    checkpoints: list[int] = field(default_factory=list)
    signed: int = 0
    macs_checked: bool = False
    model_hash: str = ""
    first_break: Break | None = None
    repair: Repair | None = None

    @property
    def ok(self) -> bool:
        """No broken link (a pending crash repair does not count as one)."""
        return self.first_break is None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``lensemble verify --json``): the fields, ``ok`` and ``status``.

        ``status`` is ``valid`` or ``broken`` (``lensemble verify`` prints ``bad_input`` or
        ``error`` itself when it cannot verify at all).
        """
        out = asdict(self)
        out["ok"] = self.ok
        out["status"] = "valid" if self.ok else "broken"
        out["first_break"] = (
            dict(asdict(self.first_break), message=self.first_break.sentence())
            if self.first_break
            else None
        )
        out["repair"] = self.repair.reason if self.repair else None
        return out


class _Broken(Exception):
    def __init__(self, brk: Break, at: Position | None = None) -> None:
        super().__init__(brk.sentence())
        self.brk = brk
        # A ledger line's own break by default; the checkpoint pass places its breaks.
        self.placed = at is not None
        self.at: Position = at if at is not None else (brk.line or 0, 0)


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
        is the earliest broken link in chain order (:data:`Position`), whichever check found it.

    Raises:
        UsageError: The ledger is a version 1 ledger.
    """
    ledger_path = run_dir / ledger_name
    report = VerifyReport(str(run_dir), str(ledger_path), macs_checked=signer is not None)
    parsed = parse_ledger(ledger_path)
    if parsed.legacy:
        raise legacy_error(ledger_path)
    report.signed = sum(isinstance(line.body.get("mac"), dict) for line in parsed.lines)
    breaks: list[_Broken] = []
    if signer is None and report.signed == 0 and parsed.lines:
        # A run is signed from its first round or not at all: signed checkpoints beside a
        # ledger without a MAC mean the ledger's MACs were removed (a key would catch it too).
        signature = record_signature(run_dir, ledger_name)
        if signature is not None:
            breaks.append(
                _Broken(
                    Break(
                        str(ledger_path),
                        1,
                        f"carries no MAC, but {signature.where} is signed ({signature.algorithm}, "
                        f"key {signature.key_id}): the ledger's MACs were removed",
                    )
                )
            )
    try:
        _walk(report, parsed, ledger_path, signer)
    except _Broken as exc:
        breaks.append(exc)
    breaks += _checkpoints(report, parsed, run_dir, ledger_path, signer, chained=not breaks)
    if breaks:
        report.first_break = min(breaks, key=lambda b: b.at).brk
        report.repair = None
    return report


def _walk(report: VerifyReport, parsed: ParsedLedger, path: Path, signer: Signer | None) -> None:
    if parsed.bad is not None:
        raise _Broken(Break(str(path), parsed.bad[0], f"is not a JSON object ({parsed.bad[1]})"))
    prev = ""
    model = ""
    version = 0
    for line in parsed.lines:
        body = line.body
        n = line.number
        if body.get("ledger") != LEDGER_FORMAT:
            raise _Broken(
                Break(
                    str(path),
                    n,
                    "has another ledger format",
                    LEDGER_FORMAT,
                    str(body.get("ledger")),
                )
            )
        if body.get("seq") != n:
            raise _Broken(
                Break(str(path), n, "has the wrong sequence number", str(n), str(body.get("seq")))
            )
        if body.get("prev") != prev:
            raise _Broken(
                Break(
                    str(path), n, "does not chain to the previous line", prev, str(body.get("prev"))
                )
            )
        digest = line_digest(body)
        if digest != line.line_hash:
            raise _Broken(
                Break(
                    str(path),
                    n,
                    "was edited: its content does not hash to its line_hash",
                    line.line_hash,
                    digest,
                )
            )
        _check_mac(line, signer, path)
        try:
            record = line.record
        except IntegrityError as exc:
            raise _Broken(Break(str(path), n, exc.message.rstrip(";"))) from None
        if not model and version == 0:
            model = record.parent_hash
        if record.parent_hash != model:
            raise _Broken(
                Break(
                    str(path),
                    n,
                    f"round {record.round} does not start from the last committed model",
                    model,
                    record.parent_hash,
                )
            )
        if record.round != version:
            raise _Broken(
                Break(str(path), n, "is out of order: wrong round", str(version), str(record.round))
            )
        if record.state == "closed":
            if record.model_hash == record.parent_hash:
                raise _Broken(Break(str(path), n, "commits no new model", "a new hash", model))
            model = record.model_hash
            version += 1
            report.committed += 1
        elif record.model_hash != record.parent_hash or body.get("checkpoint") is not None:
            raise _Broken(
                Break(
                    str(path),
                    n,
                    "is an aborted attempt that changes the model",
                    record.parent_hash,
                    record.model_hash,
                )
            )
        prev = line.line_hash
        report.lines += 1
    report.model_hash = model


def _check_mac(line: LedgerLine, signer: Signer | None, path: Path) -> None:
    mac = line.body.get("mac")
    if signer is None:
        return
    if not isinstance(mac, dict):
        raise _Broken(
            Break(
                str(path),
                line.number,
                f"carries no MAC, but a signing key is given ({signer.algorithm}, key "
                f"{signer.key_id})",
                "a MAC",
                "none",
            )
        )
    value = str(mac.get("value", ""))
    if mac.get("key_id") != signer.key_id:
        raise _Broken(
            Break(
                str(path),
                line.number,
                f"is signed with key {str(mac.get('key_id'))[:80]}, not with the key given "
                f"({signer.algorithm}, key {signer.key_id})",
                signer.key_id,
                str(mac.get("key_id"))[:80],
            )
        )
    if not signer.verify(line.line_hash, value):
        raise _Broken(
            Break(
                str(path),
                line.number,
                f"has a MAC that does not verify with key {signer.key_id}",
                # Never the MAC the key would give: printed, it would sign a forged line.
                f"a MAC of this line made with key {signer.key_id}",
                value,
            )
        )


def _checkpoints(
    report: VerifyReport,
    parsed: ParsedLedger,
    run_dir: Path,
    path: Path,
    signer: Signer | None,
    *,
    chained: bool,
) -> list[_Broken]:
    """Check every checkpoint on disk against its line; returns every broken link found.

    Each checkpoint is checked on its own, so a broken one does not hide an earlier one; the
    caller keeps the earliest in chain order. ``chained`` says the ledger walk found no break
    (only then can a torn or lost final line be restored from the latest checkpoint).
    """
    breaks: list[_Broken] = []
    committed: dict[int, LedgerLine] = {}
    for entry in parsed.lines:
        record = _record_or_none(entry)
        if record is not None and record.state == "closed":
            committed.setdefault(record.round + 1, entry)  # the first line that claims it
    beyond = len(parsed.lines) + 1  # where a line the ledger lacks would be
    versions = checkpoint_versions(run_dir)
    last_version = max(committed, default=0)
    last_line = committed[last_version].number if committed else 0
    for version in versions:
        line = committed.get(version)
        at: Position = (0, 1) if version == 0 else ((line.number, 1) if line else (beyond, 1))
        # Only the latest checkpoint, one version past the ledger, may restore a lost line.
        tail = chained and version == last_version + 1 == versions[-1]
        try:
            _one_checkpoint(
                report, parsed, run_dir, path, signer, version=version, line=line, tail=tail
            )
        except _Broken as exc:
            if not exc.placed:
                exc.at = at
            breaks.append(exc)
    if parsed.torn is not None and report.repair is None:
        if versions and versions[-1] == last_version:
            # The torn line is an attempt after the latest checkpoint: a resume redoes it.
            report.repair = Repair(
                [line.text for line in parsed.lines],
                f"drops the final line {beyond}, torn by a crash (an attempt the resume redoes)",
            )
        elif not any(b.at == (beyond, 0) for b in breaks):  # not named by the loop already
            breaks.append(
                _Broken(
                    Break(
                        str(path),
                        beyond,
                        "is torn and no checkpoint holds its record",
                        "a complete line",
                        parsed.torn[:80],
                    )
                )
            )
    if last_version and not versions:
        breaks.append(
            _Broken(
                Break(
                    str(checkpoint_folder(run_dir)),
                    None,
                    "holds no checkpoint, but the ledger commits rounds",
                    f"model-v{last_version:06d}.safetensors",
                    "none",
                ),
                (last_line, 1),
            )
        )
    if versions and versions[-1] < last_version:
        breaks.append(
            _Broken(
                Break(
                    str(checkpoint_folder(run_dir)),
                    None,
                    "lacks the checkpoint of the last committed round",
                    f"model-v{last_version:06d}.safetensors",
                    f"model-v{versions[-1]:06d}.safetensors",
                ),
                (last_line, 1),
            )
        )
    return breaks


def _one_checkpoint(
    report: VerifyReport,
    parsed: ParsedLedger,
    run_dir: Path,
    path: Path,
    signer: Signer | None,
    *,
    version: int,
    line: LedgerLine | None,
    tail: bool,
) -> None:
    """Check checkpoint ``version`` against ``line``, the committed line naming it (if any).

    ``tail``: the checkpoint is the latest, one version past the ledger's last committed round,
    so its record may restore a final line a crash tore or lost (sets ``report.repair``).
    """
    ckpt_path = checkpoint_path(run_dir, version)
    try:
        ckpt = audit_checkpoint(ckpt_path, version, signer)
    except IntegrityError as exc:
        # The break names the file already: "<file>: is named version 6, but ...".
        if isinstance(exc, HashMismatch):  # both hashes as fields, as a ledger break has them
            of_line = f" (it is the checkpoint of ledger line {line.number})" if line else ""
            raise _Broken(
                Break(str(ckpt_path), None, exc.what + of_line, exc.recorded, exc.recomputed)
            ) from None
        what = exc.message.rstrip(";").removeprefix(f"checkpoint {ckpt_path} ")
        raise _Broken(Break(str(ckpt_path), None, what)) from None
    report.checkpoints.append(version)
    if version == 0:
        first = _record_or_none(parsed.lines[0]) if parsed.lines else None
        start = first.parent_hash if first is not None else ckpt.model_hash
        if ckpt.model_hash != start:
            raise _Broken(
                Break(
                    str(ckpt_path),
                    None,
                    "is not the model line 1 starts from",
                    start,
                    ckpt.model_hash,
                )
            )
        return
    if line is not None:
        _match(line, ckpt, ckpt_path, path)
        return
    if tail:
        report.repair = _tail_repair(parsed, ckpt, path, signer)
        if report.repair is not None:
            report.model_hash = ckpt.model_hash
            return
    if parsed.torn is not None:
        beyond = len(parsed.lines) + 1
        raise _Broken(
            Break(
                str(path),
                beyond,
                f"is torn and does not agree with checkpoint v{version}'s copy of round "
                f"{version - 1}",
                "a prefix of the checkpoint's line",
                parsed.torn[:80],
            ),
            (beyond, 0),
        )
    raise _Broken(
        Break(
            str(ckpt_path),
            None,
            f"commits round {version - 1}, which the ledger does not record",
            "a committed ledger line",
            "none",
        )
    )


def _record_or_none(line: LedgerLine) -> RoundRecord | None:
    """The line's round record, or None when it has none (the ledger walk names that line)."""
    try:
        return line.record
    except IntegrityError:
        return None


def _match(line: LedgerLine, ckpt: AuditedCheckpoint, ckpt_path: Path, path: Path) -> None:
    recorded = line.body.get("checkpoint")
    if recorded != ckpt.state_hash:
        raise _Broken(
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
        raise _Broken(
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
        raise _Broken(
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
    parsed: ParsedLedger, ckpt: AuditedCheckpoint, path: Path, signer: Signer | None
) -> Repair | None:
    """The repair restoring the latest checkpoint's line, if the ledger's tail agrees with it."""
    if not ckpt.record:
        return None
    good = list(parsed.lines)
    record: dict[str, Any] = json.loads(ckpt.record)
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
    :func:`verify_run` checks every MAC when given the key.

    Returns:
        The signature found, or None when neither a line nor a checkpoint carries a MAC.
    """
    ledger_path = run_dir / ledger_name
    for line in parse_ledger(ledger_path).lines:
        mac = line.body.get("mac")
        if isinstance(mac, dict):
            return Signature(
                str(mac.get("alg", ""))[:40], str(mac.get("key_id", ""))[:200], str(ledger_path)
            )
    for version in checkpoint_versions(run_dir):
        ckpt_path = checkpoint_path(run_dir, version)
        meta = checkpoint_metadata(ckpt_path)
        if meta.get("mac"):
            return Signature(
                meta.get("mac_alg", "")[:40], meta.get("mac_key_id", "")[:200], str(ckpt_path)
            )
    return None


def require_matching_key(run_dir: Path, ledger_name: str, signer: Signer | None) -> None:
    """Refuse to continue a run record with a signing key that does not fit it.

    A resume without the key of a signed record would append lines and checkpoints without a
    MAC, which no later ``lensemble verify --key-file`` accepts; a key for a record without any
    MAC cannot tell a run that was never signed from one whose MACs were stripped, and would
    leave the record half signed. Both are refused before any work (docs/run-record.md).

    Args:
        run_dir: The run folder.
        ledger_name: The ledger inside it.
        signer: The key this process signs with (None: unsigned).

    Raises:
        UsageError: The record is signed and no key is configured (exit 2; names the ledger
            and the environment variable to set).
        IntegrityError: A key is configured and the record, which holds lines or
            checkpoints, carries no MAC at all (exit 3).
    """
    ledger_path = run_dir / ledger_name
    signature = record_signature(run_dir, ledger_name)
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
    has_record = bool(parse_ledger(ledger_path).lines) or bool(checkpoint_versions(run_dir))
    if signer is not None and signature is None and has_record:
        raise IntegrityError(
            f"the run record {ledger_path} carries no MAC, but a signing key is configured "
            f"({signer.algorithm}, key {signer.key_id}): either the run was never signed or "
            "its MACs were removed;",
            remediation=f"if it was started without a key, resume it with {KEY_FILE_ENV}, "
            f"{KEY_ENV} and {KMS_KEY_ENV} unset (a run is signed from its first round or not at "
            "all); if it was signed, restore the folder from a backup.",
        )


def require_valid(run_dir: Path, ledger_name: str, signer: Signer | None) -> VerifyReport:
    """Verify before any work: apply a pending crash repair, or refuse with the broken link.

    Checks first that ``signer`` fits the record (:func:`require_matching_key`). Writes only
    to apply a repair (after checking there is room).

    Raises:
        IntegrityError: The record is broken (names the line and both hashes; exit 3), or a
            key is configured for a record without any MAC.
        UsageError: The ledger is a version 1 ledger, or the record is signed and no key is
            configured (exit 2).
        DiskFull: No room to apply the repair.
    """
    from lensemble.federation.ledger import Ledger

    if parse_ledger(run_dir / ledger_name).legacy:
        raise legacy_error(run_dir / ledger_name)
    require_matching_key(run_dir, ledger_name, signer)
    report = verify_run(run_dir, ledger_name, signer)
    if report.first_break is None and report.repair is not None:
        Ledger(run_dir / ledger_name).rewrite_texts(report.repair.texts, why=report.repair.reason)
        report = verify_run(run_dir, ledger_name, signer)
    if report.first_break is not None:
        raise broken_record(run_dir, report.first_break)
    return report


def broken_record(run_dir: Path, first_break: Break) -> IntegrityError:
    """The error that refuses work on a broken run record (exit 3), naming its first break."""
    return IntegrityError(
        f"the run record in {run_dir} is broken at {first_break.sentence()};",
        remediation="nothing was trained; restore the folder from a backup, or start a new "
        "run folder (`lensemble verify` prints the same).",
    )
