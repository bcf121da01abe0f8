"""Verify a run folder's record: the ledger's line chain, the model chain, checkpoints, MACs.

:func:`verify_run` is what ``lensemble verify`` prints and what every resume (``simulate
--resume``, the network coordinator, ``lensemble up``) runs before any training or network I/O.
It reads only; :func:`repair_tail` is the one repair a resume may make: a final ledger line torn
or lost by a crash is rewritten from the latest checkpoint's copy of that round's record when
the two agree (the torn text is a prefix of the line rebuilt from the checkpoint).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lensemble.errors import IntegrityError
from lensemble.federation.checkpoint_audit import (
    AuditedCheckpoint,
    audit_checkpoint,
    checkpoint_folder,
    checkpoint_path,
    checkpoint_versions,
)
from lensemble.federation.ledger import (
    LEDGER_FORMAT,
    LedgerLine,
    ParsedLedger,
    build_line,
    canonical,
    legacy_error,
    line_digest,
    parse_ledger,
)
from lensemble.federation.signing import Signer


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
        """JSON-ready form (``lensemble verify --json``)."""
        out = asdict(self)
        out["ok"] = self.ok
        out["first_break"] = (
            dict(asdict(self.first_break), message=self.first_break.sentence())
            if self.first_break
            else None
        )
        out["repair"] = self.repair.reason if self.repair else None
        return out


class _Broken(Exception):
    def __init__(self, brk: Break) -> None:
        super().__init__(brk.sentence())
        self.brk = brk


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
        chains, every checkpoint on disk matches its line, and every MAC checks.

    Raises:
        UsageError: The ledger is a version 1 ledger.
    """
    ledger_path = run_dir / ledger_name
    report = VerifyReport(str(run_dir), str(ledger_path), macs_checked=signer is not None)
    parsed = parse_ledger(ledger_path)
    if parsed.legacy:
        raise legacy_error(ledger_path)
    try:
        _walk(report, parsed, ledger_path, signer)
        _checkpoints(report, parsed, run_dir, ledger_path, signer)
    except _Broken as exc:
        report.first_break = exc.brk
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
        record = line.record
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
                f"carries no MAC, but the run is signed ({signer.algorithm}, key {signer.key_id})",
                "a MAC",
                "none",
            )
        )
    value = str(mac.get("value", ""))
    if mac.get("key_id") != signer.key_id or not signer.verify(line.line_hash, value):
        raise _Broken(
            Break(
                str(path),
                line.number,
                f"has a MAC that does not verify with key {signer.key_id}",
                signer.mac(line.line_hash) if signer.algorithm == "hmac-sha256" else "a valid MAC",
                value,
            )
        )


def _checkpoints(
    report: VerifyReport,
    parsed: ParsedLedger,
    run_dir: Path,
    path: Path,
    signer: Signer | None,
) -> None:
    report.signed = sum(isinstance(line.body.get("mac"), dict) for line in parsed.lines)
    committed = {
        line.record.round + 1: line for line in parsed.lines if line.record.state == "closed"
    }
    versions = checkpoint_versions(run_dir)
    last_version = max(committed, default=0)
    for version in versions:
        try:
            ckpt = audit_checkpoint(checkpoint_path(run_dir, version), version, signer)
        except IntegrityError as exc:
            raise _Broken(
                Break(str(checkpoint_path(run_dir, version)), None, exc.message.rstrip(";"))
            ) from None
        report.checkpoints.append(version)
        if version == 0:
            first = parsed.lines[0].record.parent_hash if parsed.lines else ckpt.model_hash
            if ckpt.model_hash != first:
                raise _Broken(
                    Break(
                        str(checkpoint_path(run_dir, 0)),
                        None,
                        "is not the model line 1 starts from",
                        first,
                        ckpt.model_hash,
                    )
                )
            continue
        line = committed.get(version)
        if line is None:
            if version == last_version + 1 and version == versions[-1]:
                report.repair = _tail_repair(parsed, ckpt, path, signer)
                if report.repair is not None:
                    report.model_hash = ckpt.model_hash
                    continue
            if parsed.torn is not None:
                raise _Broken(
                    Break(
                        str(path),
                        len(parsed.lines) + 1,
                        f"is torn and does not agree with checkpoint v{version}'s copy of round "
                        f"{version - 1}",
                        "a prefix of the checkpoint's line",
                        parsed.torn[:80],
                    )
                )
            raise _Broken(
                Break(
                    str(checkpoint_path(run_dir, version)),
                    None,
                    f"commits round {version - 1}, which the ledger does not record",
                    "a committed ledger line",
                    "none",
                )
            )
        _match(line, ckpt, checkpoint_path(run_dir, version), path)
    if parsed.torn is not None and report.repair is None:
        if versions and versions[-1] == last_version:
            # The torn line is an attempt after the latest checkpoint: a resume redoes it.
            report.repair = Repair(
                [line.text for line in parsed.lines],
                f"drops the final line {len(parsed.lines) + 1}, torn by a crash (an attempt the "
                "resume redoes)",
            )
        else:
            raise _Broken(
                Break(
                    str(path),
                    len(parsed.lines) + 1,
                    "is torn and no checkpoint holds its record",
                    "a complete line",
                    parsed.torn[:80],
                )
            )
    if last_version and not versions:
        raise _Broken(
            Break(
                str(checkpoint_folder(run_dir)),
                None,
                "holds no checkpoint, but the ledger commits rounds",
                f"model-v{last_version:06d}.safetensors",
                "none",
            )
        )
    if versions and versions[-1] < last_version:
        raise _Broken(
            Break(
                str(checkpoint_folder(run_dir)),
                None,
                "lacks the checkpoint of the last committed round",
                f"model-v{last_version:06d}.safetensors",
                f"model-v{versions[-1]:06d}.safetensors",
            )
        )


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
    if ckpt.record != canonical(line.body.get("record")):
        raise _Broken(
            Break(
                str(ckpt_path),
                None,
                f"holds another round record than line {line.number}",
                line.line_hash,
                ckpt.record[:80],
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


def require_valid(run_dir: Path, ledger_name: str, signer: Signer | None) -> VerifyReport:
    """Verify before any work: apply a pending crash repair, or refuse with the broken link.

    Writes only to apply a repair (after checking there is room).

    Raises:
        IntegrityError: The record is broken (names the line and both hashes; exit 3).
        UsageError: The ledger is a version 1 ledger.
        DiskFull: No room to apply the repair.
    """
    from lensemble.federation.ledger import Ledger

    report = verify_run(run_dir, ledger_name, signer)
    if report.first_break is None and report.repair is not None:
        Ledger(run_dir / ledger_name).rewrite_texts(report.repair.texts)
        report = verify_run(run_dir, ledger_name, signer)
    if report.first_break is not None:
        raise IntegrityError(
            f"the run record in {run_dir} is broken at {report.first_break.sentence()};",
            remediation="nothing was trained; restore the folder from a backup, or start a new "
            "run folder (`lensemble verify` prints the same).",
        )
    return report
