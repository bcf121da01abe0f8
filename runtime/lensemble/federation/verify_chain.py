"""The ledger pass of verification: every line chains, every committed model chains, MACs hold.

:func:`walk` reads a parsed ledger line by line and raises :class:`BrokenLink` at the first line
that does not hold: another format, a wrong sequence number, a ``prev`` that is not the previous
line's hash, content that does not hash to its ``line_hash``, a MAC that does not verify with
the given key, a record that is not a round record, a round that does not start from the last
committed model or is out of order, a commit without a new model, an abort that changes it
(docs/run-record.md), or suspicion scores and divergence-guard verdicts that do not replay from
the lines (:mod:`lensemble.federation.verify_history`).
"""

from __future__ import annotations

from pathlib import Path

from lensemble.errors import IntegrityError
from lensemble.federation.ledger import (
    LEDGER_FORMAT,
    LedgerLine,
    ParsedLedger,
    RoundRecord,
    line_digest,
)
from lensemble.federation.signing import Signer
from lensemble.federation.verify_history import HistoryReplay
from lensemble.federation.verify_report import Break, BrokenLink, VerifyReport


def walk(report: VerifyReport, parsed: ParsedLedger, path: Path, signer: Signer | None) -> None:
    """Check every line of ``parsed`` in order; count them and the commits in ``report``.

    Args:
        report: Gets ``lines``, ``committed`` and ``model_hash`` (the last committed model).
        parsed: The ledger, parsed.
        path: The ledger file (named in breaks).
        signer: Checks each line's MAC when given (a missing MAC is a break).

    Raises:
        BrokenLink: The first line that does not hold.
    """
    if parsed.bad is not None:
        raise BrokenLink(Break(str(path), parsed.bad[0], f"is not a JSON object ({parsed.bad[1]})"))
    prev = ""
    model = ""
    version = 0
    history = HistoryReplay()
    for line in parsed.lines:
        _check_link(line, prev, path)
        check_mac(line, signer, path)
        record = _record(line, path)
        if not model and version == 0:
            model = record.parent_hash
        _check_lineage(record, line.number, model, version, path)
        problem = history.check(record)
        if problem is not None:
            raise BrokenLink(Break(str(path), line.number, problem))
        if record.state == "closed":
            model = record.model_hash
            version += 1
            report.committed += 1
        elif line.body.get("checkpoint") is not None:
            raise BrokenLink(
                Break(
                    str(path),
                    line.number,
                    "is an aborted attempt that changes the model",
                    record.parent_hash,
                    record.model_hash,
                )
            )
        prev = line.line_hash
        report.lines += 1
    report.model_hash = model
    report.privacy, report.privacy_recomputed = history.privacy, history.privacy_recomputed


def _check_link(line: LedgerLine, prev: str, path: Path) -> None:
    """The line's format, sequence number, link to the previous line and own hash."""
    body, n = line.body, line.number
    if body.get("ledger") != LEDGER_FORMAT:
        raise BrokenLink(
            Break(str(path), n, "has another ledger format", LEDGER_FORMAT, str(body.get("ledger")))
        )
    if body.get("seq") != n:
        raise BrokenLink(
            Break(str(path), n, "has the wrong sequence number", str(n), str(body.get("seq")))
        )
    if body.get("prev") != prev:
        raise BrokenLink(
            Break(str(path), n, "does not chain to the previous line", prev, str(body.get("prev")))
        )
    digest = line_digest(body)
    if digest != line.line_hash:
        raise BrokenLink(
            Break(
                str(path),
                n,
                "was edited: its content does not hash to its line_hash",
                line.line_hash,
                digest,
            )
        )


def _record(line: LedgerLine, path: Path) -> RoundRecord:
    try:
        return line.record
    except IntegrityError as exc:
        raise BrokenLink(Break(str(path), line.number, exc.message.rstrip(";"))) from None


def _check_lineage(record: RoundRecord, n: int, model: str, version: int, path: Path) -> None:
    """The record starts from the last committed model, in round order, and commits or not."""
    if record.parent_hash != model:
        raise BrokenLink(
            Break(
                str(path),
                n,
                f"round {record.round} does not start from the last committed model",
                model,
                record.parent_hash,
            )
        )
    if record.round != version:
        raise BrokenLink(
            Break(str(path), n, "is out of order: wrong round", str(version), str(record.round))
        )
    if record.state == "closed" and record.model_hash == record.parent_hash:
        raise BrokenLink(Break(str(path), n, "commits no new model", "a new hash", model))
    if record.state != "closed" and record.model_hash != record.parent_hash:
        raise BrokenLink(
            Break(
                str(path),
                n,
                "is an aborted attempt that changes the model",
                record.parent_hash,
                record.model_hash,
            )
        )


def check_mac(line: LedgerLine, signer: Signer | None, path: Path) -> None:
    """Check the line's MAC with ``signer`` (nothing to check without one).

    Raises:
        BrokenLink: The line carries no MAC, names another key, or its MAC does not verify.
    """
    mac = line.body.get("mac")
    if signer is None:
        return
    if not isinstance(mac, dict):
        raise BrokenLink(
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
        raise BrokenLink(
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
        raise BrokenLink(
            Break(
                str(path),
                line.number,
                f"has a MAC that does not verify with key {signer.key_id}",
                # Never the MAC the key would give: printed, it would sign a forged line.
                f"a MAC of this line made with key {signer.key_id}",
                value,
            )
        )
