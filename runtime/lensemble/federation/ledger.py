"""The round ledger: one JSON line per round attempt, each line chained to the one before.

Format ``lensemble-ledger-v2`` (docs/run-record.md). Each line is canonical JSON (sorted keys, no
spaces) of::

    {"checkpoint": <state hash of the checkpoint this round committed, or null>,
     "ledger": "lensemble-ledger-v2", "line_hash": "sha256:...", "mac": {...} (signed runs only),
     "prev": <line_hash of the previous line, "" on line 1>, "record": <RoundRecord>,
     "seq": <1-based line number>}

``line_hash`` is SHA-256 over the canonical JSON of the line without ``line_hash`` and ``mac``,
so any edit anywhere in a line (also fields added to the record later) breaks it, and ``prev``
carries that into every later line. ``mac`` is the signer's MAC of ``line_hash``. Committed
records also chain models: a line's ``parent_hash`` is the previous committed ``model_hash``.
Version 1 ledgers (bare records, before chained lines) are refused with a one-line message.

Lines are appended with one write and an fsync, so a crash loses at most the line being
written; the checkpoint holds a copy of its round's record to restore it
(:mod:`lensemble.federation.verify`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import MISSING, asdict, dataclass, field, fields
from datetime import UTC, datetime
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from lensemble.durable import append_line, atomic_write, check_free_space
from lensemble.errors import IntegrityError, UsageError
from lensemble.federation.signing import Signer

_log = logging.getLogger("lensemble.federation.ledger")

LEDGER_FORMAT = "lensemble-ledger-v2"


@dataclass(frozen=True)
class RoundRecord:
    """Lineage of one round attempt.

    Attributes:
        round: Round index ``t``.
        attempt: Attempt number (0-based).
        state: ``closed`` or ``aborted``.
        contributors: Participant ids whose pseudo-gradients were averaged, sorted.
        excluded: Participant id -> why it did not contribute (``timeout``, ``straggler``,
            ``rank_failure``, a transport's absence reason, a rejection reason).
        parent_hash: Hash of the model the round started from.
        model_hash: Hash of the committed model (equals ``parent_hash`` when aborted).
        mean_inner_loss: Mean of the contributors' self-reported mean inner losses (unitless),
            or None.
        bytes_up: Pseudo-gradient payload bytes received for this attempt.
        bytes_down: Model payload bytes sent to participants for this attempt.
        quantization: Wire format of the pseudo-gradients.
        wall_s: Wall time from opening until the outcome is known (seconds): for a commit,
            until the new model's hash; the checkpoint write and the append of this very
            line come after it and are not included (see ``extra``).
        compute_s: Participants' inner-step time on the round's critical path (seconds).
        non_compute_s: ``wall_s - compute_s``: serialization, transport, validation,
            aggregation, outer step and model hash (seconds); not the checkpoint write.
        config_hash: Hash of the config that produced the line.
        extra: More numbers (free-form). ``previous_commit_s``: seconds the coordinator
            spent writing the previous committed round's checkpoint and appending its ledger
            line (absent on the first line a coordinator process writes). ``collect_s``:
            transport-clock seconds from the opening to the attempt's last accepted update
            (absent when none was accepted); the straggler cutoff of later rounds derives
            from it (``federation.stragglers``).
        updates: Contributor id -> ``{"hash": "sha256:...", "bytes": n}`` of its accepted
            pseudo-gradient payload.
        aggregator: How the contributions were combined (``canonical-mean``).
        software: ``lensemble <version>`` that wrote the line.
        opened_at: UTC time the attempt opened (ISO 8601).
        closed_at: UTC time the attempt closed (ISO 8601).
        defences: What the coordinator's defences decided (plain JSON data, docs/security.md):
            ``aggregator``; ``norms`` (participant id -> L2 norm of its update),
            ``norm_bound`` (the bound applied, or None), ``clipped`` (participant id -> the
            factor its update was scaled by), ``rejected`` (participant id -> ``{"reason":
            code, "detail": sentence}``, whether rejected when judged or at aggregation),
            ``relative_change`` (how far the new model moved, relative to max(1, its norm)),
            ``precommit`` (None, or why the new model was not committed), ``cosines``
            (participant id -> cosine of its update with the outer momentum, None in round 0),
            ``suspicion`` (participant id -> its history score,
            :mod:`lensemble.federation.suspicion`), ``set_aside`` (participant id -> the score
            before the round that named it a suspect and left its update out of the mean,
            :mod:`lensemble.federation.set_aside`; absent when that defence is off),
            ``best_reported`` (the score of the version the round trained from and the best
            version so far, :mod:`lensemble.federation.keep_best`; only under
            ``federation.final_model: best_reported``), ``trained_from`` (the hash of the
            model the attempt's updates were computed from when it is not ``parent_hash``:
            ``federation.overlap`` ``one_round``, :mod:`lensemble.federation.overlap`). Empty in
            lines written before these defences existed.
        self_reported: Participant id -> the statistics it reported about itself
            (``mean_loss``, ``compute_s``, ``heldout_loss``), after the coordinator's bounds; a
            value outside them is null. Unverified: only the divergence guard reads them, as a
            majority vote (``guard``).
        guard: The divergence guard's verdict on the round's model (committed lines; empty
            when the guard is off, and in lines written before it existed): ``version``,
            ``action`` (``first``, ``improved``, ``steady``, ``degraded``, ``rollback``,
            ``unjudged``), ``ratios``, ``median_ratio``, ``compared_with``, ``best``,
            ``best_hash``, ``streak``, ``rollbacks``, its settings, and for a rollback
            ``rollback_to``, ``rollback_hash``, ``suspects`` and ``why``
            (:mod:`lensemble.federation.guard`).
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
    updates: dict[str, dict[str, Any]] = field(default_factory=dict)
    aggregator: str = ""
    software: str = ""
    opened_at: str = ""
    closed_at: str = ""
    defences: dict[str, Any] = field(default_factory=dict)
    self_reported: dict[str, dict[str, float | None]] = field(default_factory=dict)
    guard: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """One compact JSON line with sorted keys."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))


_RECORD_FIELDS = frozenset(f.name for f in fields(RoundRecord))


def canonical(obj: Any) -> str:
    """Canonical JSON text: sorted keys, no spaces (what every hash in the run record covers)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def line_digest(body: dict[str, Any]) -> str:
    """``sha256:<hex>`` of a line's canonical JSON without ``line_hash`` and ``mac``."""
    hashed = {k: v for k, v in body.items() if k not in ("line_hash", "mac")}
    return "sha256:" + hashlib.sha256(canonical(hashed).encode()).hexdigest()


@dataclass(frozen=True)
class LedgerLine:
    """One parsed line of a v2 ledger.

    Attributes:
        number: 1-based line number in the file.
        body: The whole line as parsed JSON.
        text: The line as stored (without its newline).
    """

    number: int
    body: dict[str, Any]
    text: str

    @property
    def line_hash(self) -> str:
        """The hash the line declares for itself."""
        return str(self.body.get("line_hash", ""))

    @cached_property
    def record(self) -> RoundRecord:
        """The round record the line carries.

        Raises:
            IntegrityError: The record does not have the fields of a round record.
        """
        return record_from_dict(self.body.get("record"), f"line {self.number}")


def record_from_dict(data: Any, where: str) -> RoundRecord:
    """A :class:`RoundRecord` from parsed JSON, ignoring fields this version does not know.

    Every known field must hold the JSON its annotation declares (nested values included, an
    integer never a boolean, a float any number), so no reader of a record meets a type it did
    not expect; a few fields are narrower still (:data:`_NARROWER`).

    Raises:
        IntegrityError: ``data`` is not an object with every required field, each of its type
            (the message names ``where`` and the first field that is not).
    """
    if not isinstance(data, dict):
        raise IntegrityError(f"{where} carries no round record;")
    known = {k: v for k, v in data.items() if k in _RECORD_FIELDS}
    missing = sorted(
        f.name
        for f in fields(RoundRecord)
        if f.name not in known and f.default is MISSING and f.default_factory is MISSING
    )
    if missing:
        raise IntegrityError(
            f"{where} is not a valid round record (it lacks {', '.join(missing)});"
        )
    for name, value in known.items():
        expected = _field_problem(name, value)
        if expected is not None:
            raise IntegrityError(
                f"{where} is not a valid round record (field {name} holds {_json_kind(value)}, "
                f"expected {expected});"
            )
    return RoundRecord(**known)


def _index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _update_entries(value: dict[str, Any]) -> bool:
    return all(
        isinstance(entry.get("hash"), str) and _index(entry.get("bytes"))
        for entry in value.values()
    )


#: Fields narrower than their annotation: the check, and what it expects (in words).
_NARROWER: dict[str, tuple[Callable[[Any], bool], str]] = {
    "round": (_index, "a non-negative integer"),
    "attempt": (_index, "a non-negative integer"),
    "state": (lambda v: v in ("closed", "aborted"), '"closed" or "aborted"'),
    "bytes_up": (_index, "a non-negative integer"),
    "bytes_down": (_index, "a non-negative integer"),
    "updates": (_update_entries, 'objects {"hash": string, "bytes": non-negative integer}'),
}


@cache
def _record_hints() -> dict[str, Any]:
    return typing.get_type_hints(RoundRecord)


def _field_problem(name: str, value: Any) -> str | None:
    """What field ``name`` should hold, in words, when ``value`` is not that; else None."""
    hint = _record_hints()[name]
    if not _conforms(value, hint):
        return _hint_text(hint)
    narrower = _NARROWER.get(name)
    if narrower is not None and not narrower[0](value):
        return narrower[1]
    return None


def _is_number(value: Any) -> bool:
    # JSON has numbers: an integer is a float too, a boolean neither.
    return isinstance(value, int | float) and not isinstance(value, bool)


#: How a scalar annotation of RoundRecord is checked on parsed JSON.
_SCALAR_CHECKS: dict[Any, Callable[[Any], bool]] = {
    float: _is_number,
    int: lambda v: type(v) is int,
    str: lambda v: type(v) is str,
    bool: lambda v: type(v) is bool,
    type(None): lambda v: v is None,
}


def _conforms(value: Any, hint: Any) -> bool:
    """Whether parsed JSON ``value`` is of type ``hint`` (the annotations RoundRecord uses)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, arg) for arg in args)
    if origin is list:
        return isinstance(value, list) and all(_conforms(item, args[0]) for item in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            isinstance(key, str) and _conforms(item, args[1]) for key, item in value.items()
        )
    check = _SCALAR_CHECKS.get(hint)
    if check is None:
        raise TypeError(f"RoundRecord uses {hint}, which record_from_dict cannot check")
    return check(value)


def _hint_text(hint: Any) -> str:
    """``hint`` in the words of JSON (``dict[str, float]`` -> ``an object of numbers``)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_hint_text(arg) for arg in args)
    if origin is list:
        return f"a list of {_plural(args[0])}"
    if origin is dict:
        return f"an object of {_plural(args[1])}"
    return {int: "an integer", float: "a number", str: "a string", bool: "a boolean"}.get(
        hint, "null" if hint is type(None) else "any JSON"
    )


def _plural(hint: Any) -> str:
    text = _hint_text(hint)
    for article in ("an ", "a "):
        if text.startswith(article):
            return text.removeprefix(article) + "s"
    return text


def _json_kind(value: Any) -> str:
    """The JSON type of a parsed value, in words (the value itself may be hostile and long)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value}" if len(repr(value)) <= 24 else "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


def build_line(
    seq: int,
    prev: str,
    record: dict[str, Any],
    checkpoint: str | None,
    signer: Signer | None,
) -> str:
    """The canonical text of a ledger line (without newline).

    Args:
        seq: 1-based line number.
        prev: ``line_hash`` of the previous line, ``""`` for line 1.
        record: The round record as a dict (``dataclasses.asdict``).
        checkpoint: State hash of the checkpoint the round committed, None for an abort.
        signer: Adds ``mac`` when given.
    """
    body: dict[str, Any] = {
        "checkpoint": checkpoint,
        "ledger": LEDGER_FORMAT,
        "prev": prev,
        "record": record,
        "seq": seq,
    }
    body["line_hash"] = line_digest(body)
    if signer is not None:
        body["mac"] = {
            "alg": signer.algorithm,
            "key_id": signer.key_id,
            "value": signer.mac(body["line_hash"]),
        }
    return canonical(body)


@dataclass
class ParsedLedger:
    """A ledger file split into parsed lines and what could not be parsed.

    Attributes:
        lines: Every complete, parseable line, in order.
        torn: The final line's text when it is unterminated and not valid JSON (a crash tore it).
        bad: ``(line number, why)`` of the first unparseable line that is not a torn tail.
        legacy: The file is a version 1 ledger.
        raw: The bytes parsed (the file's whole contents).
    """

    lines: list[LedgerLine] = field(default_factory=list)
    torn: str | None = None
    bad: tuple[int, str] | None = None
    legacy: bool = False
    raw: bytes = b""


def parse_ledger(path: Path) -> ParsedLedger:
    """Read a ledger file without judging it (see :mod:`lensemble.federation.verify`)."""
    if not path.exists():
        return ParsedLedger()
    return parse_ledger_bytes(path.read_bytes())


def parse_ledger_bytes(raw: bytes) -> ParsedLedger:
    """Split a ledger's contents into lines without judging them (:func:`parse_ledger`)."""
    out = ParsedLedger(raw=raw)
    texts = raw.decode("utf-8", errors="replace").split("\n")
    complete = raw.endswith(b"\n")
    if complete:
        texts.pop()  # the empty string after the final newline
    for number, text in enumerate(texts, 1):
        try:
            body = _json_object(text)
        except ValueError as exc:
            if number == len(texts) and not complete:
                out.torn = text
            else:
                out.bad = (number, str(exc))
            return out
        if "ledger" not in body and "model_hash" in body:
            out.legacy = True
            return out
        out.lines.append(LedgerLine(number, body, text))
    return out


def _json_object(text: str) -> dict[str, Any]:
    """One line's JSON object.

    Raises:
        ValueError: Not JSON, not an object, or nested deeper than the parser can go.
    """
    try:
        body = json.loads(text)
    except RecursionError:
        raise ValueError("nested deeper than the JSON parser goes") from None
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    return body


class Ledger:
    """Append-only ``ledger.jsonl`` in format :data:`LEDGER_FORMAT`.

    Args:
        path: The ledger file; its folder is created.
        signer: Signs each appended line when given.
    """

    def __init__(self, path: Path, signer: Signer | None = None) -> None:
        self.path = path
        self.signer = signer
        path.parent.mkdir(parents=True, exist_ok=True)
        self._tail: tuple[int, str] | None = None

    def continue_after(self, lines: list[LedgerLine]) -> None:
        """Append after ``lines``, the file's verified contents, without reading it again."""
        self._tail = (lines[-1].number, lines[-1].line_hash) if lines else (0, "")

    def _tail_state(self) -> tuple[int, str]:
        if self._tail is None:
            parsed = parse_ledger(self.path)
            last = parsed.lines[-1] if parsed.lines else None
            self._tail = (last.number, last.line_hash) if last else (0, "")
        return self._tail

    def append(self, record: RoundRecord, checkpoint: str | None = None) -> str:
        """Append one chained line durably (one write + fsync); returns its line hash.

        Args:
            record: The attempt's record.
            checkpoint: State hash of the checkpoint this round committed (None for an abort).

        Raises:
            DiskFull: No room for the line (the ledger is left unchanged).
        """
        seq, prev = self._tail_state()
        text = build_line(seq + 1, prev, asdict(record), checkpoint, self.signer)
        append_line(self.path, text)
        self._tail = (seq + 1, json.loads(text)["line_hash"])
        return self._tail[1]

    def lines(self) -> list[LedgerLine]:
        """Every line, in order.

        Raises:
            IntegrityError: A line is not valid JSON (a torn final line included).
            UsageError: The ledger is in the version 1 format.
        """
        parsed = parse_ledger(self.path)
        if parsed.legacy:
            raise legacy_error(self.path)
        if parsed.bad is not None or parsed.torn is not None:
            number = parsed.bad[0] if parsed.bad else len(parsed.lines) + 1
            raise IntegrityError(
                f"{self.path}:{number} is not a valid ledger line;",
                remediation="run `lensemble verify` on the folder, or `--resume` to repair a "
                "line torn by a crash.",
            )
        return parsed.lines

    def records(self) -> list[RoundRecord]:
        """Every line's round record, in order (same errors as :meth:`lines`)."""
        return [line.record for line in self.lines()]

    def rewrite_texts(
        self, texts: Iterable[str], *, why: str, old: bytes | None = None
    ) -> Path | None:
        """Replace the ledger atomically with these line texts (resume drops or repairs a tail).

        Nothing is lost and nothing happens quietly: when the contents change, the old ledger
        is first kept, byte for byte, beside it as ``<name>.<UTC time>.before-repair``, and a
        warning names the repair and that file.

        Args:
            texts: The complete new contents, line by line.
            why: What the rewrite repairs, e.g. ``"drops the final line 5, torn by a crash"``.
            old: The file's current contents when the caller read them already (under the
                folder's lock); read from the file when None.

        Returns:
            The file keeping the old contents, or None when they were already these.

        Raises:
            DiskFull: Not enough room (checked before anything is written).
        """
        data = "".join(t + "\n" for t in texts).encode()
        if old is None:
            old = self.path.read_bytes() if self.path.exists() else b""
        if old == data:
            return None
        check_free_space(self.path.parent, len(data) + len(old))
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        kept = self.path.with_name(f"{self.path.name}.{stamp}.before-repair")
        atomic_write(kept, old)
        atomic_write(self.path, data)
        self._tail = None
        _log.warning("the ledger %s %s; its previous contents are kept in %s", self.path, why, kept)
        return kept


def legacy_error(path: Path) -> UsageError:
    """The error for a version 1 ledger (model hashes chained, lines not)."""
    return UsageError(
        f"{path} is a version 1 ledger (written before lines were chained; {LEDGER_FORMAT} is "
        "needed to verify or resume);",
        remediation="start a new run folder; the old run's model hash chain stays readable "
        "line by line as JSON.",
    )


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
                f"ledger round {record.round} has parent {record.parent_hash}, but the "
                f"previous committed model is {chain[-1]};",
                remediation="the ledger was edited or mixes two runs; use a fresh output_dir.",
            )
        chain.append(record.model_hash)
    return chain
