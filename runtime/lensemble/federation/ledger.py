"""The round ledger: one JSON line per round attempt, a hash chain of committed models.

Each line is a :class:`RoundRecord`. Committed lines chain: a line's ``parent_hash`` is the
previous committed line's ``model_hash``; aborted lines keep ``model_hash == parent_hash``.
Lines are appended with a flush and fsync, so a crash loses at most the line being written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lensemble.errors import IntegrityError


@dataclass(frozen=True)
class RoundRecord:
    """Lineage of one round attempt.

    Attributes:
        round: Round index ``t``.
        attempt: Attempt number (0-based).
        state: ``closed`` or ``aborted``.
        contributors: Participant ids whose pseudo-gradients were averaged, sorted.
        excluded: Participant id -> why it did not contribute (``timeout``, a rejection reason).
        parent_hash: Hash of the model the round started from.
        model_hash: Hash of the committed model (equals ``parent_hash`` when aborted).
        mean_inner_loss: Mean of the contributors' self-reported mean inner losses (unitless),
            or None.
        bytes_up: Pseudo-gradient payload bytes received for this attempt.
        bytes_down: Model payload bytes sent to participants for this attempt.
        quantization: Wire format of the pseudo-gradients.
        wall_s: Wall time from opening to closing (seconds).
        compute_s: Participants' inner-step time on the round's critical path (seconds).
        non_compute_s: ``wall_s - compute_s``: serialization, transport, validation,
            aggregation, commit (seconds).
        config_hash: Hash of the config that produced the line.
        extra: Further numbers (name -> value).
        defences: What the coordinator's defences decided (plain JSON data, docs/security.md):
            ``aggregator``; ``norms`` (participant id -> L2 norm of its update),
            ``norm_bound`` (the bound applied, or None), ``clipped`` (participant id -> the
            factor its update was scaled by), ``rejected`` (participant id -> ``{"reason":
            code, "detail": sentence}``, whether rejected when judged or at aggregation),
            ``relative_change`` (how far the new model moved, relative to max(1, its norm)),
            ``precommit`` (None, or why the new model was not committed). Empty in lines
            written before these defences existed.
        self_reported: Participant id -> the statistics it reported about itself
            (``mean_loss``, ``compute_s``), after the coordinator's bounds; a value outside
            them is null. Unverified: nothing the coordinator decides depends on them.
    """

    round: int
    attempt: int
    state: str
    contributors: list[str]
    excluded: dict[str, str]
    parent_hash: str
    model_hash: str
    mean_inner_loss: float | None
    bytes_up: int
    bytes_down: int
    quantization: str
    wall_s: float
    compute_s: float
    non_compute_s: float
    config_hash: str
    extra: dict[str, float] = field(default_factory=dict)
    defences: dict[str, Any] = field(default_factory=dict)
    self_reported: dict[str, dict[str, float | None]] = field(default_factory=dict)

    def to_json(self) -> str:
        """One compact JSON line with sorted keys."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))


class Ledger:
    """Append-only ``ledger.jsonl``.

    Args:
        path: The ledger file; its folder is created.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: RoundRecord) -> None:
        """Append one line durably (flush + fsync)."""
        with self.path.open("a", encoding="utf-8") as f:
            f.write(record.to_json() + "\n")
            f.flush()
            os.fsync(f.fileno())

    def records(self) -> list[RoundRecord]:
        """Every line, in order.

        Raises:
            IntegrityError: A line is not valid JSON of a round record.
        """
        if not self.path.exists():
            return []
        out = []
        for number, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
            try:
                out.append(RoundRecord(**json.loads(line)))
            except (ValueError, TypeError) as exc:
                raise IntegrityError(
                    f"{self.path}:{number} is not a valid ledger line ({exc});",
                    remediation="restore the ledger from a backup or start a new output_dir.",
                ) from None
        return out

    def rewrite(self, records: Iterable[RoundRecord]) -> None:
        """Replace the ledger atomically (used by resume to drop uncommitted tail lines)."""
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            for record in records:
                f.write(record.to_json() + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


def committed_chain(records: Iterable[RoundRecord]) -> list[str]:
    """Model hashes of the committed rounds, checking that they chain.

    Returns:
        ``[hash of version 1, hash of version 2, ...]``.

    Raises:
        IntegrityError: A committed line's parent is not the previous committed model.
    """
    chain: list[str] = []
    for record in records:
        if record.state != "closed":
            continue
        if chain and record.parent_hash != chain[-1]:
            raise IntegrityError(
                f"ledger round {record.round} has parent {record.parent_hash[:19]}..., but the "
                f"previous committed model is {chain[-1][:19]}...;",
                remediation="the ledger was edited or mixes two runs; use a fresh output_dir.",
            )
        chain.append(record.model_hash)
    return chain
