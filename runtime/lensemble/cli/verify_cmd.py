"""``lensemble verify RUN_DIR``: check a run folder's tamper-evident record (docs/run-record.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from lensemble.errors import EXIT_BAD_INPUT, EXIT_FAIL_CLOSED, LensembleError, UsageError

if TYPE_CHECKING:
    from lensemble.federation.verify import VerifyReport


def verify(
    run_dir: Path = typer.Argument(..., help="The run folder (run.output_dir).", metavar="RUN_DIR"),
    json_out: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
    key_file: Path | None = typer.Option(
        None,
        "--key-file",
        help="HMAC key to check every MAC with (default: LENSEMBLE_LEDGER_KEY_FILE, "
        "LENSEMBLE_LEDGER_KEY or LENSEMBLE_LEDGER_KMS_KEY_ID).",
    ),
    ledger: str = typer.Option(
        "ledger.jsonl", "--ledger", help="The ledger inside RUN_DIR (observability.ledger_path)."
    ),
    require_signature: bool = typer.Option(
        False,
        "--require-signature",
        help="Fail (exit 3) unless the record is signed and its signature was checked with "
        "the key.",
    ),
) -> None:
    """Walk the ledger's chain, check every checkpoint against its line and every MAC.

    Exit 0 when the record holds, 3 at the first broken link in chain order (named with its
    line and both full hashes), 2 when RUN_DIR is not a run folder or the key is unusable.
    Without a key a signed record's MACs are not checked, and a note on stderr says so;
    --require-signature makes that (and an unsigned record) exit 3. Reads only. With --json
    every outcome is one JSON object on stdout, an unusable input included (status
    "bad_input" and the error; the sentence also on stderr).
    """
    try:
        report = _verify(run_dir, ledger, key_file)
        if require_signature and report.first_break is None:
            _require_signature(report)
    except LensembleError as exc:
        if json_out:
            failure = {
                "status": "bad_input" if exc.exit_code == EXIT_BAD_INPUT else "error",
                "ok": False,
                "error": str(exc),
                "code": exc.code,
                "exit_code": exc.exit_code,
                "run_dir": str(run_dir),
                "ledger": str(run_dir / ledger),
            }
            sys.stdout.write(json.dumps(failure, sort_keys=True) + "\n")
        raise
    if json_out:
        sys.stdout.write(json.dumps(report.to_dict(), sort_keys=True) + "\n")
    else:
        _print(report)
    if report.first_break is None and report.signed and not report.macs_checked:
        sys.stderr.write(
            f"note: the record is signed, but no key was given, so its signature was NOT "
            f"checked (anyone who can write {run_dir} could have rewritten it); pass "
            "--key-file or set LENSEMBLE_LEDGER_KEY_FILE to check it, and --require-signature "
            "to fail without it.\n"
        )
    if report.first_break is not None:
        raise typer.Exit(EXIT_FAIL_CLOSED)


def _require_signature(report: VerifyReport) -> None:
    """Refuse a record whose signature was not checked (``--require-signature``).

    Raises:
        IntegrityError: The record carries no MAC, or no key was given to check them (exit 3).
    """
    from lensemble.errors import IntegrityError

    if report.signed and report.macs_checked:
        return
    if report.signed:
        raise IntegrityError(
            f"the run record in {report.run_dir} is signed, but no key was given, so its "
            "signature was not checked (--require-signature);",
            remediation="pass the key with --key-file, or set LENSEMBLE_LEDGER_KEY_FILE, "
            "LENSEMBLE_LEDGER_KEY or LENSEMBLE_LEDGER_KMS_KEY_ID.",
        )
    raise IntegrityError(
        f"the run record in {report.run_dir} is not signed (--require-signature);",
        remediation="sign runs from their start with LENSEMBLE_LEDGER_KEY_FILE (an unsigned "
        "record can be rewritten consistently by anyone who can write its folder).",
    )


def _verify(run_dir: Path, ledger: str, key_file: Path | None) -> VerifyReport:
    """The report of ``run_dir``.

    Raises:
        UsageError: RUN_DIR is missing or not a run folder, a file cannot be read, the key is
            unusable, or the ledger is a version 1 ledger.
        ToolMissing: A KMS key is named but boto3 is missing.
    """
    from lensemble.federation.signing import signer_from_env
    from lensemble.federation.verify import verify_run

    if not run_dir.is_dir():
        raise UsageError(
            f"the run folder {run_dir} does not exist or is not a folder;",
            remediation="pass a run folder (the run's run.output_dir).",
        )
    if not (run_dir / ledger).is_file():
        raise UsageError(
            f"{run_dir} holds no {ledger};",
            remediation="pass a run folder (the run's run.output_dir), or --ledger for another "
            "ledger path.",
        )
    signer = signer_from_env(key_file=key_file, audit=True)
    try:
        return verify_run(run_dir, ledger, signer)
    except OSError as exc:  # a file of the record that cannot be read (permissions)
        raise UsageError(
            f"cannot read {exc.filename or run_dir} ({exc.strerror or exc});",
            remediation="run lensemble verify as a user who may read the whole run folder.",
        ) from None


def _print(report: VerifyReport) -> None:
    """The report as one line (``OK ...`` or ``BROKEN <file>:<line>: ...``) plus any note."""
    from lensemble.cli.progress import plural

    if report.first_break is not None:
        sys.stdout.write(f"BROKEN {report.first_break.sentence()}\n")
    else:
        macs = (
            f", {plural(report.signed, 'MAC')} checked"
            if report.macs_checked
            else (
                f", {plural(report.signed, 'MAC')} present but not checked (no key)"
                if report.signed
                else ", unsigned"
            )
        )
        sys.stdout.write(
            f"OK {plural(report.lines, 'line')}, {plural(report.committed, 'round')} committed, "
            "checkpoints "
            f"{', '.join(f'v{v}' for v in report.checkpoints) or 'none'} match{macs}; "
            f"final model {report.model_hash or '(none)'}\n"
        )
    if report.first_break is None and report.privacy is not None:
        from lensemble.cli.run_summary import central_privacy_line

        how = (
            "recomputed from every line"
            if report.privacy_recomputed
            else "release count checked; epsilon not recomputed: install the [dp] extra"
        )
        sys.stdout.write(f"{central_privacy_line(report.privacy)} ({how})\n")
    if report.repair is not None:
        sys.stdout.write(f"note: a resume {report.repair.reason}.\n")
