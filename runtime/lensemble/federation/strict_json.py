r"""JSON read as strictly as serde_json reads it (the reference safetensors parser's reader).

Python's ``json`` is more lenient than serde_json in ways a payload header must not be, since
whatever Lensemble accepts the reference parser must accept too
(``tests/federation/test_payload_differential.py``): it reads UTF-16 and UTF-32 and surrogates
written as UTF-8, ``NaN`` and ``Infinity``, numbers of any size, repeated keys (keeping the
last) and lone surrogate escapes (``\ud800``). :func:`loads` refuses all of them; it may be
stricter than serde_json (it refuses a repeated key in any object, and an integer beyond 64
bits anywhere), never looser.
"""

from __future__ import annotations

import json
import re
from collections import Counter

#: Integers serde_json reads as 64-bit integers (anything beyond becomes a float there).
_INT_RANGE = range(-(2**63), 2**64)
#: A ``\u`` escape of a UTF-16 surrogate: the only way a lone surrogate gets into a string of
#: text that is valid UTF-8.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _strict_int(text: str) -> int | float:
    """A JSON integer as serde_json reads it: ``-0`` is a float, beyond 64 bits is refused."""
    value = int(text)
    if text.startswith("-0"):
        return -0.0
    if value not in _INT_RANGE:
        raise ValueError(f"integer {text[:24]} is out of the 64-bit range")
    return value


def _strict_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:24]} is out of range")
    return value


def _no_constant(text: str) -> object:
    raise ValueError(f"{text} is not JSON")


def _unique_object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object whose keys are unique (serde_json refuses a repeated field)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        repeated = next(key for key, n in Counter(key for key, _ in pairs).items() if n > 1)
        raise ValueError(f"key {repeated[:64]!r} appears twice")
    return out


def _require_unicode(value: object) -> None:
    """Raise ValueError for any string in ``value`` (keys included) that is not valid Unicode."""
    if isinstance(value, str):
        value.encode("utf-8")  # UnicodeEncodeError (a ValueError) for a lone surrogate
    elif isinstance(value, list):
        for item in value:
            _require_unicode(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _require_unicode(key)
            _require_unicode(item)


def loads(raw: bytes) -> object:
    """Parse UTF-8 JSON ``raw`` as strictly as serde_json.

    Raises:
        UnicodeDecodeError: ``raw`` is not UTF-8 (surrogates written as UTF-8 included).
        ValueError: Not JSON, or JSON serde_json refuses (see the module docstring).
        RecursionError: Nested deeper than Python's parser goes (callers bound depth first).
    """
    text = raw.decode("utf-8")
    value = json.loads(
        text,
        object_pairs_hook=_unique_object,
        parse_int=_strict_int,
        parse_float=_strict_float,
        parse_constant=_no_constant,
    )
    if _SURROGATE_ESCAPE.search(text):  # rare: only then is every string checked
        _require_unicode(value)
    return value
