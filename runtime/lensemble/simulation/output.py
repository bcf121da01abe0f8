"""The output folder of a run on one machine: what is written where, what a new run replaces.

Layout under ``run.output_dir``: ``coordinator/`` (checkpoints), the ledger
(``observability.ledger_path``), ``metrics.jsonl`` (one :class:`RoundMetrics` line per committed
round), ``report.png``, ``participants/<id>/data`` (each participant's private data cache) and
``participants/<id>/state`` (its inner state), and for a local-processes run ``certs/`` and
``logs/``.

``metrics.jsonl`` is appended one fsync'd line per round (:func:`lensemble.durable.append_line`);
a line torn or lost in a crash is dropped and rebuilt from the ledger on resume
(:func:`recover_metrics`), with the scores a line written at the time has
(:func:`lensemble.simulation.scoring.rebuild_metrics`), so an interrupted run leaves no hole.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lensemble.durable import append_line, atomic_write, check_free_space
from lensemble.errors import UsageError
from lensemble.federation.checkpoint import CheckpointStore
from lensemble.federation.verify import broken_record, verify_run

if TYPE_CHECKING:
    from lensemble.config import LensembleConfig
    from lensemble.federation.ledger import RoundRecord
    from lensemble.simulation.summary import RoundMetrics

METRICS_FILE = "metrics.jsonl"
REPORT_FILE = "report.png"


def prepare_output_dir(config: LensembleConfig, resume: bool) -> str | None:
    """Create the output folder and check it before any work; say what happens to a previous run.

    Args:
        config: The run's config (``run.output_dir``, ``federation.rounds``).
        resume: Whether the run continues the one in the folder.

    Returns:
        A ``note: ...`` line for the user (nothing to resume, a finished run resumed, or a
        previous run being replaced), or None.

    Raises:
        UsageError: The folder cannot be created or written, or ``--resume`` would shrink a run.
        IntegrityError: ``--resume`` of a record whose checkpoints claim more rounds than
            ``federation.rounds`` and that is broken (exit 3, names the first break).
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
    rounds = "round" if committed == 1 else "rounds"
    if resume and not versions:
        return f"note: nothing to resume in {out}; starting a fresh run."
    if not resume and committed:
        return (
            f"note: replacing the previous run in {out} ({committed} {rounds} committed); use "
            "--resume to continue it, or -o to write elsewhere."
        )
    if resume and committed == config.federation.rounds:
        return (
            f"note: the run in {out} already committed all {committed} {rounds}; nothing is "
            "trained, only its summary is made again (pass a larger --rounds to continue it)."
        )
    if resume and committed > config.federation.rounds:
        # The count comes from checkpoint file names: a record broken there (a file renamed
        # to a later version) is the cause to report, not the rounds (the full verification,
        # MACs included, runs before any work).
        report = verify_run(Path(out), config.observability.ledger_path, None)
        if report.first_break is not None:
            raise broken_record(Path(out), report.first_break)
        raise UsageError(
            f"the run in {out} already committed {committed} {rounds}, more than "
            f"federation.rounds ({config.federation.rounds});",
            remediation=f"pass --rounds {committed} or more to continue it.",
        )
    return None


def fresh_output(out: Path, ledger_path: str = "ledger.jsonl") -> None:
    """Remove a previous run's coordinator state, ledger, metrics, report and inner states.

    The copies of the ledger that a resume's repair kept go too.

    Each participant's data cache (``participants/<id>/data``), any certificates and the
    coordinator's lock file (held by the caller) are kept.
    """
    for item in (out / "coordinator").glob("*"):
        if item.name == "lock":
            continue
        if item.is_dir():
            shutil.rmtree(item, ignore_errors=True)
        else:
            item.unlink(missing_ok=True)
    for name in (ledger_path, METRICS_FILE, REPORT_FILE):
        (out / name).unlink(missing_ok=True)
    for kept in out.glob(f"{ledger_path}.*.before-repair"):  # Ledger.rewrite_texts's copies
        kept.unlink(missing_ok=True)
    for folder in (out / "participants").glob("*/state"):
        shutil.rmtree(folder, ignore_errors=True)


def read_metrics(out: Path) -> list[dict[str, Any]]:
    """Every complete line of ``metrics.jsonl`` as a dict, in file order (empty if none).

    A final line torn by a crash is skipped (resume rebuilds it).
    """
    path = out / METRICS_FILE
    if not path.exists():
        return []
    lines = []
    for text in path.read_text(encoding="utf-8").splitlines():
        try:
            lines.append(json.loads(text))
        except ValueError:
            break
    return lines


def read_round_metrics(out: Path) -> list[RoundMetrics]:
    """Every complete line of ``metrics.jsonl`` as a :class:`RoundMetrics`, in file order."""
    from dataclasses import fields

    from lensemble.simulation.summary import RoundMetrics

    names = {f.name for f in fields(RoundMetrics)}
    return [RoundMetrics(**{k: v for k, v in d.items() if k in names}) for d in read_metrics(out)]


def recover_metrics(
    out: Path,
    records: Iterable[RoundRecord],
    version: int,
    rebuild: Callable[[RoundRecord], RoundMetrics],
) -> int:
    """Make ``metrics.jsonl`` hold exactly one line per committed round before ``version``.

    Lines of rounds ``>= version`` (a resume redoes them) and a torn final line are dropped; a
    committed round whose line a crash lost gets one built by ``rebuild`` from its ledger
    record. The file is rewritten atomically, after checking there is room, and only when
    something changed.

    Args:
        out: The run folder.
        records: The ledger's records.
        version: The model version the run resumes from.
        rebuild: Builds a lost round's line (scores included when the round was evaluated).

    Returns:
        How many lines were rebuilt.
    """
    path = out / METRICS_FILE
    raw = path.read_text(encoding="utf-8") if path.exists() else ""
    by_round: dict[int, str] = {}
    for text in raw.splitlines():
        try:
            round_index = int(json.loads(text)["round"])
        except (ValueError, KeyError, TypeError):
            break
        if round_index < version:
            by_round.setdefault(round_index, text)
    rebuilt = 0
    for record in records:
        if record.state == "closed" and record.round < version and record.round not in by_round:
            by_round[record.round] = rebuild(record).to_json()
            rebuilt += 1
    text = "".join(by_round[r] + "\n" for r in sorted(by_round))
    if text != raw:
        check_free_space(out, len(text))
        atomic_write(path, text.encode())
    return rebuilt


def append_metrics(out: Path, line: RoundMetrics) -> None:
    """Append one round's line to ``metrics.jsonl`` (one write, fsync'd)."""
    append_line(out / METRICS_FILE, line.to_json())


def write_metrics(out: Path, lines: Iterable[RoundMetrics]) -> None:
    """Replace ``metrics.jsonl`` with ``lines`` atomically."""
    text = "".join(m.to_json() + "\n" for m in lines)
    atomic_write(out / METRICS_FILE, text.encode())
