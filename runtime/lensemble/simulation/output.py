"""The output folder of a run on one machine: what is written where, what a new run replaces.

Layout under ``run.output_dir``: ``coordinator/`` (checkpoints), the ledger
(``observability.ledger_path``), ``metrics.jsonl`` (one :class:`RoundMetrics` line per committed
round), ``report.png``, ``participants/<id>/data`` (each participant's private data cache) and
``participants/<id>/state`` (its inner state), and for a local-processes run ``certs/`` and
``logs/``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lensemble.errors import UsageError
from lensemble.federation.checkpoint import CheckpointStore

if TYPE_CHECKING:
    from lensemble.config import LensembleConfig
    from lensemble.simulation.summary import RoundMetrics

METRICS_FILE = "metrics.jsonl"
REPORT_FILE = "report.png"


def prepare_output_dir(config: LensembleConfig, resume: bool) -> str | None:
    """Create the output folder and check it before any work; say what happens to a previous run.

    Args:
        config: The run's config (``run.output_dir``, ``federation.rounds``).
        resume: Whether the run continues the one in the folder.

    Returns:
        A ``note: ...`` line for the user (nothing to resume, or a previous run being replaced),
        or None.

    Raises:
        UsageError: The folder cannot be created or written, or ``--resume`` would shrink a run.
    """
    out = config.run.output_dir
    # Fail before collecting data, not after a minute of work.
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"cannot create the output folder {out} ({exc.strerror});",
            remediation="pass a writable folder with --output-dir or set run.output_dir.",
        ) from None
    if not os.access(out, os.W_OK):
        raise UsageError(
            f"the output folder {out} is not writable;",
            remediation="pass a writable folder with --output-dir or set run.output_dir.",
        )
    versions = CheckpointStore(Path(out)).versions()
    committed = versions[-1] if versions else 0
    if resume and not versions:
        return f"note: nothing to resume in {out}; starting a fresh run."
    if not resume and committed:
        return (
            f"note: replacing the previous run in {out} ({committed} rounds committed); use "
            "--resume to continue it, or -o to write elsewhere."
        )
    if resume and committed > config.federation.rounds:
        raise UsageError(
            f"the run in {out} already committed {committed} rounds, more than "
            f"federation.rounds ({config.federation.rounds});",
            remediation=f"pass --rounds {committed} or more to continue it.",
        )
    return None


def fresh_output(out: Path, ledger_path: str = "ledger.jsonl") -> None:
    """Remove a previous run's coordinator state, ledger, metrics, report and inner states.

    Each participant's data cache (``participants/<id>/data``) and any certificates are kept.
    """
    shutil.rmtree(out / "coordinator", ignore_errors=True)
    for name in (ledger_path, METRICS_FILE, REPORT_FILE):
        (out / name).unlink(missing_ok=True)
    for folder in (out / "participants").glob("*/state"):
        shutil.rmtree(folder, ignore_errors=True)


def read_metrics(out: Path) -> list[dict[str, Any]]:
    """Every line of ``metrics.jsonl`` as a dict, in file order (empty if there is none)."""
    path = out / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def keep_metrics_before(out: Path, version: int) -> None:
    """Drop the ``metrics.jsonl`` lines of rounds ``>= version`` (a resume redoes them)."""
    path = out / METRICS_FILE
    if not path.exists():
        return
    kept = [
        line
        for line in path.read_text(encoding="utf-8").splitlines()
        if json.loads(line)["round"] < version
    ]
    path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")


def append_metrics(out: Path, line: RoundMetrics) -> None:
    """Append one round's line to ``metrics.jsonl``."""
    with (out / METRICS_FILE).open("a", encoding="utf-8") as f:
        f.write(line.to_json() + "\n")


def write_metrics(out: Path, lines: Iterable[RoundMetrics]) -> None:
    """Replace ``metrics.jsonl`` with ``lines``."""
    text = "".join(m.to_json() + "\n" for m in lines)
    (out / METRICS_FILE).write_text(text, encoding="utf-8")
