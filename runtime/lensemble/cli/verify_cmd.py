"""``lensemble verify RUN_DIR``: check a run folder's tamper-evident record (docs/run-record.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from lensemble.errors import EXIT_FAIL_CLOSED, UsageError


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
) -> None:
    """Walk the ledger's chain, check every checkpoint against its line and every MAC.

    Exit 0 when the record holds, 3 at the first broken link (named with its line and both
    full hashes), 2 when RUN_DIR is not a run folder or the key is unusable. Reads only.
    """
    from lensemble.federation.signing import signer_from_env
    from lensemble.federation.verify import verify_run

    if not (run_dir / ledger).is_file():
        raise UsageError(
            f"{run_dir} holds no {ledger};",
            remediation="pass a run folder (the run's run.output_dir), or --ledger for another "
            "ledger path.",
        )
    signer = signer_from_env(key_file=key_file, audit=True)
    report = verify_run(run_dir, ledger, signer)
    if json_out:
        sys.stdout.write(json.dumps(report.to_dict(), sort_keys=True) + "\n")
    else:
        if report.first_break is not None:
            sys.stdout.write(f"BROKEN {report.first_break.sentence()}\n")
        else:
            macs = (
                f", {report.signed} MACs checked"
                if report.macs_checked
                else (
                    f", {report.signed} MACs present but not checked (no key)"
                    if report.signed
                    else ", unsigned"
                )
            )
            sys.stdout.write(
                f"OK {report.lines} lines, {report.committed} rounds committed, checkpoints "
                f"{', '.join(f'v{v}' for v in report.checkpoints) or 'none'} match{macs}; "
                f"final model {report.model_hash or '(none)'}\n"
            )
        if report.repair is not None:
            sys.stdout.write(f"note: a resume {report.repair.reason}.\n")
    if report.first_break is not None:
        raise typer.Exit(EXIT_FAIL_CLOSED)
