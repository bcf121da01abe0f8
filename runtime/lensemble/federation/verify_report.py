"""What verifying a run record reports: the first break, a pending crash repair, the counts.

The types :func:`lensemble.federation.verify.verify_run` returns and its passes share
(:mod:`lensemble.federation.verify_chain`, :mod:`lensemble.federation.verify_checkpoints`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

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
        r"""``file:line: what (expected X, found Y)`` on one line, safe to print.

        The values come from the record, which anyone who could write it may fill with
        anything: every character that is not printable (control and terminal escapes, line
        breaks, lone surrogates) is shown as its ``\x``/``\u`` escape.
        """
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        values = f" (expected {self.expected}, found {self.found})" if self.expected else ""
        return _printable(f"{where}: {self.what}{values}")


def _printable(text: str) -> str:
    r"""``text`` with every character that is not printable escaped (``\x1b``, ``\ud800``)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


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
        privacy: The newest line's ``defences.central_privacy`` (epsilon, delta, releases,
            noise), its release count checked, or None for a run without central DP.
        privacy_recomputed: Whether every line's epsilon was recomputed from its own fields
            (it is not where Opacus, the ``[dp]`` extra, is missing).
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
    privacy: dict[str, Any] | None = None
    privacy_recomputed: bool = True

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


class BrokenLink(Exception):
    """A broken link found while verifying, with where it sits in chain order.

    Attributes:
        brk: The break.
        placed: Whether ``at`` was given (a checkpoint break placed by its pass).
        at: Its position; a ledger line's own break by default.
    """

    def __init__(self, brk: Break, at: Position | None = None) -> None:
        super().__init__(brk.sentence())
        self.brk = brk
        # A ledger line's own break by default; the checkpoint pass places its breaks.
        self.placed = at is not None
        self.at: Position = at if at is not None else (brk.line or 0, 0)
