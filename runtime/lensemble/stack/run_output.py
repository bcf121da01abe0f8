"""What a stack's containers print, read for people: round progress, last errors, the hash chain.

Nothing here is trusted for anything but the report: ``lensemble verify`` checks a ledger.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

#: How much of a container's last error line a stack error quotes (characters).
ERROR_QUOTE_CHARS = 600


def last_error(lines: Iterable[str]) -> str | None:
    """The last ``error: ...`` line a Lensemble process wrote (its text, bounded), if any."""
    said = None
    for line in lines:
        if line.startswith("error: "):
            said = line.removeprefix("error: ").strip()
    return said[:ERROR_QUOTE_CHARS] if said else None


def round_progress(line: str) -> str | None:
    """A one-line summary of a coordinator log record worth showing while following a run.

    Records are JSON objects (``observability.log_format: json``). Shown: records with a
    ``round`` field (``round 3: committed``; the text is the first of ``message``, ``msg``,
    ``event`` and ``state``, so a logged ledger line shows as ``round 3: closed``; a text that
    already starts with ``round`` is shown as it is) and records at level ERROR or above.

    Returns:
        The summary, or None for lines not worth showing.
    """
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(record, dict):
        return None
    text = next((str(record[k]) for k in ("message", "msg", "event", "state") if record.get(k)), "")
    if "round" in record:
        # Messages that already name their round ("round 3 attempt 0 committed ...") stand alone.
        if text.startswith("round "):
            return text
        return f"round {record['round']}: {text}".rstrip(": ")
    if str(record.get("level", "")).upper() in ("ERROR", "CRITICAL"):
        return f"coordinator error: {text}"
    return None


def committed_hashes(ledger: bytes) -> list[str]:
    """Model hashes of the committed (``closed``) rounds of a ledger, in order.

    A line wraps its round record under ``record`` (ledger v2, docs/run-record.md). Lines that
    are not JSON objects with a string ``model_hash`` are skipped: the ledger is read only to
    report the run, never trusted for anything else (``lensemble verify`` checks it).
    """
    hashes: list[str] = []
    for raw in ledger.splitlines():
        try:
            line = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        record = line.get("record") if isinstance(line, dict) else None
        if isinstance(record, dict) and record.get("state") == "closed":
            value = record.get("model_hash")
            if isinstance(value, str):
                hashes.append(value)
    return hashes
