"""Text a peer sent, made safe to log: escaped, capped, and bounded before it is read.

Everything another process sends (a participant's id, config view, software version or leave
reason; the coordinator's messages to a participant) is untrusted. Logged as is, a newline forges
a log line, an ANSI escape rewrites a terminal, and a 3 MiB string fills the log. Every log
statement that shows peer text passes it through :func:`shown` (or :func:`shown_all`), and
requests whose fields exceed :data:`JOIN_LIMITS` (:data:`ABSTAIN_LIMITS`) are refused before
anything reads them (:func:`oversized_field`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: Longest piece of peer text shown in one log line (characters, after escaping).
MAX_SHOWN_CHARS = 200
#: Most items of a peer-supplied list shown in one log line.
MAX_SHOWN_ITEMS = 20

#: Bounds of the Join request's fields (characters). An id is a DNS label of at most 30
#: characters; a config hash is ``sha256-canon-v1:`` and 64 hex digits; a version is short; the
#: config view is the hashed part of a config (a few KiB for hundreds of participants).
JOIN_LIMITS: dict[str, int] = {
    "participant_id": 64,
    "config_hash": 128,
    "software_version": 64,
    "config_view_json": 1 << 20,
}

#: Bounds of the Abstain request's text fields (characters): an id, a session (16 hex digits)
#: and a reason (a short word of ``messages.ABSTENTION_REASONS``), with room to spare.
ABSTAIN_LIMITS: dict[str, int] = {
    "participant_id": 64,
    "session": 64,
    "reason": 64,
}


def _escaped(char: str) -> str:
    if char.isprintable():
        return "\\\\" if char == "\\" else char
    code = ord(char)
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char)
    if named is not None:
        return named
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def shown(value: object, limit: int = MAX_SHOWN_CHARS) -> str:
    """``value`` as one safe piece of a log line.

    Control and format characters (newlines, ANSI escapes, bidirectional overrides, line
    separators) and backslashes are escaped Python-style, so the result is one line that cannot
    pass for another; it is then cut to ``limit`` characters, saying how much was left out.

    Args:
        value: Peer-supplied text (``bytes`` are decoded as UTF-8 with replacement; anything
            else goes through ``str``).
        limit: Most characters of the result before the "left out" note (>= 1).

    Returns:
        A printable single-line string of at most ``limit`` characters plus a short note.
    """
    if isinstance(value, bytes):
        text = value[: limit * 4].decode("utf-8", errors="replace")
        total = len(value)
    else:
        text = value if isinstance(value, str) else str(value)
        total = len(text)
        text = text[: limit * 4 + 1]  # never escape more than can be shown
    out: list[str] = []
    size = 0
    for consumed, char in enumerate(text):
        piece = _escaped(char)
        if size + len(piece) > limit:
            return "".join(out) + f"...[{total - consumed} more]"
        out.append(piece)
        size += len(piece)
    if isinstance(value, bytes) and total > len(value[: limit * 4]):
        return "".join(out) + f"...[{total - limit * 4} more bytes]"
    return "".join(out)


def one_line(text: str) -> str:
    """``text`` with control and format characters escaped (no cap): one line, always.

    The text log formatter's backstop, so even an unescaped message never splits a line.
    """
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escaped(char) for char in text)


def shown_all(
    values: Iterable[object], limit: int = MAX_SHOWN_CHARS, items: int = MAX_SHOWN_ITEMS
) -> list[str]:
    """The first ``items`` values, each through :func:`shown`, and a count of the rest."""
    out: list[str] = []
    rest = 0
    for value in values:
        if len(out) < items:
            out.append(shown(value, limit))
        else:
            rest += 1
    if rest:
        out.append(f"...[{rest} more]")
    return out


def oversized_field(fields: Mapping[str, str | bytes], limits: Mapping[str, int]) -> str | None:
    """One sentence naming the first field longer than its limit, or None when all fit.

    Args:
        fields: Field name -> the value a peer sent.
        limits: Field name -> most characters (bytes for ``bytes`` values) allowed.
    """
    for name, limit in limits.items():
        value = fields.get(name)
        if value is not None and len(value) > limit:
            return (
                f"field {name} has {len(value)} characters, more than the {limit} allowed; "
                "send a well-formed request."
            )
    return None
