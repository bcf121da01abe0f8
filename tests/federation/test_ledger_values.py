"""Malformed values in the ledger: a clear error naming the line, never a traceback.

The line hash binds a line's contents, not their types: whoever rewrites an unsigned chain, or a
writer with a bug, can put any JSON value in any field. ``verify`` and ``--resume`` must name
the line (exit 3). Fuzzed with hypothesis over field types and nested values.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lensemble.errors import IntegrityError
from lensemble.federation.ledger import (
    RoundRecord,
    build_line,
    canonical,
    line_digest,
    parse_ledger_bytes,
)
from lensemble.federation.signing import HmacSigner
from lensemble.federation.verify_chain import walk
from lensemble.federation.verify_checkpoints import check_checkpoints
from lensemble.federation.verify_report import BrokenLink, VerifyReport

SIGNER = HmacSigner(b"k" * 32)
PATH = Path("/run/ledger.jsonl")
H = ["sha256:" + c * 64 for c in "0123"]


def _record(round_index: int, attempt: int, state: str, parent: str, model: str) -> dict[str, Any]:
    return asdict(
        RoundRecord(
            round=round_index,
            attempt=attempt,
            state=state,
            contributors=["alpha", "bravo"],
            excluded={"charlie": "timeout"},
            parent_hash=parent,
            model_hash=model,
            mean_inner_loss=0.5,
            bytes_up=1160,
            bytes_down=2160,
            quantization="none",
            wall_s=0.07,
            compute_s=0.001,
            non_compute_s=0.069,
            config_hash="sha256-canon-v1:" + "a" * 64,
            extra={"previous_commit_s": 0.01},
            updates={"alpha": {"bytes": 580, "hash": H[3]}, "bravo": {"bytes": 580, "hash": H[2]}},
            aggregator="canonical-mean",
            software="lensemble 0.1.0",
            opened_at="2026-01-01T00:00:00.000+00:00",
            closed_at="2026-01-01T00:00:01.000+00:00",
            defences={"aggregator": "mean", "clipped": {}, "norms": {"alpha": 1.0}},
            self_reported={"alpha": {"compute_s": 0.001, "mean_loss": None}},
        )
    )


def _bodies() -> list[dict[str, Any]]:
    """An honest three-line ledger: a commit, an aborted attempt, a commit (as parsed JSON)."""
    records = [
        _record(0, 0, "closed", H[0], H[1]),
        _record(1, 0, "aborted", H[1], H[1]),
        _record(1, 1, "closed", H[1], H[2]),
    ]
    prev, bodies = "", []
    for seq, record in enumerate(records, 1):
        checkpoint = None if record["state"] == "aborted" else "sha256:" + "c" * 64
        text = build_line(seq, prev, record, checkpoint, SIGNER)
        bodies.append(json.loads(text))
        prev = bodies[-1]["line_hash"]
    return bodies


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path inside ``value`` (dict keys and list indices), the top included."""
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, (*prefix, index))
    return out


#: Every place of line 1 a value can be replaced at, nested ones included; line 2 and 3 alike.
PATHS = [*sorted(_paths(_bodies()[0]), key=repr), ("record", "added_later"), ("seq",)]

JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.sampled_from(["closed", "aborted", "", "é", *H])
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def _set(body: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    """Replace the value at ``path``; TypeError when an earlier edit changed what lies there."""
    node: Any = body
    for key in path[:-1]:
        node = node[key]
    if isinstance(node, dict) and not isinstance(path[-1], str):
        raise TypeError("a JSON object's keys are strings")  # not a place of this line
    node[path[-1]] = value


def _ledger(bodies: list[dict[str, Any]], *, rehash: bool, sign: bool) -> bytes:
    """The ledger's bytes; ``rehash`` rewrites every link and hash (an unsigned forger's edit)."""
    if rehash:
        prev = ""
        for body in bodies:
            body.pop("mac", None)
            body["prev"] = prev
            body["line_hash"] = prev = line_digest(body)
            if sign:
                body["mac"] = {"alg": SIGNER.algorithm, "key_id": SIGNER.key_id}
                body["mac"]["value"] = SIGNER.mac(body["line_hash"])
    return "".join(canonical(body) + "\n" for body in bodies).encode()


def _conforms(record: RoundRecord) -> None:
    """Every field of a record the parser handed out has the type its readers rely on."""

    def number(value: Any) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool)

    def index(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    def strings(value: Any) -> bool:
        return isinstance(value, dict) and all(isinstance(k, str) for k in value)

    assert index(record.round) and index(record.attempt)
    assert record.state in ("closed", "aborted")
    assert isinstance(record.contributors, list)
    assert all(isinstance(c, str) for c in record.contributors)
    assert strings(record.excluded) and all(isinstance(v, str) for v in record.excluded.values())
    for text in (record.parent_hash, record.model_hash, record.quantization, record.config_hash):
        assert isinstance(text, str)
    for text in (record.aggregator, record.software, record.opened_at, record.closed_at):
        assert isinstance(text, str)
    assert record.mean_inner_loss is None or number(record.mean_inner_loss)
    assert index(record.bytes_up) and index(record.bytes_down)
    assert number(record.wall_s) and number(record.compute_s) and number(record.non_compute_s)
    assert strings(record.extra) and all(number(v) for v in record.extra.values())
    assert strings(record.updates)
    for update in record.updates.values():
        assert strings(update) and isinstance(update["hash"], str) and index(update["bytes"])
    assert strings(record.defences) and strings(record.self_reported)
    for stats in record.self_reported.values():
        assert strings(stats) and all(v is None or number(v) for v in stats.values())


def _judge(raw: bytes, signer: HmacSigner | None) -> None:
    """Both verification passes over ``raw`` (no checkpoint on disk): a break or nothing."""
    parsed = parse_ledger_bytes(raw)
    for line in parsed.lines:
        try:
            record = line.record
        except IntegrityError as exc:
            assert f"line {line.number} " in exc.message and "\n" not in exc.message
        else:
            _conforms(record)
    report = VerifyReport("/run", str(PATH), macs_checked=signer is not None)
    try:
        walk(report, parsed, PATH, signer)
    except BrokenLink as exc:
        assert exc.brk.file == str(PATH) and exc.brk.line is not None
        assert 1 <= exc.brk.line <= len(parsed.lines) + 1
    for brk in check_checkpoints(
        report, parsed, {}, run_dir=Path("/run"), path=PATH, signer=signer, chained=False
    ):
        assert brk.brk.what


EDITS = {
    "line": st.integers(0, 2),
    "edits": st.lists(st.tuples(st.sampled_from(PATHS), JSON_VALUES), min_size=1, max_size=3),
    "rehash": st.booleans(),
    "signed": st.booleans(),
}


@settings(max_examples=150, deadline=None)
@given(**EDITS)
def test_any_value_in_any_field_is_a_named_break_never_an_exception(
    line: int, edits: list[tuple[tuple[Any, ...], Any]], rehash: bool, signed: bool
) -> None:
    _edit_and_judge(line, edits, rehash=rehash, signed=signed)


@pytest.mark.integration
@pytest.mark.slow
@settings(max_examples=5_000, deadline=None)
@given(**EDITS)
def test_any_value_in_any_field_long(
    line: int, edits: list[tuple[tuple[Any, ...], Any]], rehash: bool, signed: bool
) -> None:
    _edit_and_judge(line, edits, rehash=rehash, signed=signed)


def _edit_and_judge(
    line: int, edits: list[tuple[tuple[Any, ...], Any]], *, rehash: bool, signed: bool
) -> None:
    bodies = _bodies()
    for path, value in edits:
        try:
            _set(bodies[line], path, copy.deepcopy(value))
        except (KeyError, IndexError, TypeError):  # an earlier edit replaced a parent
            continue
    raw = _ledger(bodies, rehash=rehash, sign=signed)
    _judge(raw, SIGNER if signed else None)
    _judge(raw, None)


def test_the_honest_ledger_of_the_fuzz_verifies() -> None:
    raw = _ledger(_bodies(), rehash=False, sign=True)
    report = VerifyReport("/run", str(PATH), macs_checked=True)
    walk(report, parse_ledger_bytes(raw), PATH, SIGNER)
    assert report.lines == 3 and report.committed == 2


@pytest.mark.parametrize(
    ("path", "value", "said"),
    [
        (("record", "round"), None, "round"),
        (("record", "round"), "1", "round"),
        (("record", "round"), True, "round"),
        (("record", "attempt"), -1, "attempt"),
        (("record", "state"), ["closed"], "state"),
        (("record", "contributors"), "alpha", "contributors"),
        (("record", "excluded"), {"charlie": {"deep": [1]}}, "excluded"),
        (("record", "updates", "alpha", "bytes"), None, "updates"),
        (("record", "extra"), {"x": "y"}, "extra"),
        (("mac", "value"), "é" * 64, "MAC"),  # a MAC that is not hex
    ],
)
def test_each_malformed_value_names_its_line(path: tuple[str, ...], value: Any, said: str) -> None:
    bodies = _bodies()
    _set(bodies[1], path, value)
    in_record = path[0] == "record"
    raw = _ledger(bodies, rehash=in_record, sign=in_record)
    parsed = parse_ledger_bytes(raw)
    if in_record:
        with pytest.raises(IntegrityError, match=rf"line 2 .*\b{said}\b"):
            _ = parsed.lines[1].record
    report = VerifyReport("/run", str(PATH), macs_checked=True)
    with pytest.raises(BrokenLink) as caught:
        walk(report, parsed, PATH, SIGNER)
    assert caught.value.brk.line == 2 and said in caught.value.brk.what


def test_a_number_out_of_the_usual_range_is_still_a_number() -> None:
    bodies = _bodies()
    _set(bodies[1], ("record", "wall_s"), math.inf)
    report = VerifyReport("/run", str(PATH), macs_checked=True)
    walk(report, parse_ledger_bytes(_ledger(bodies, rehash=True, sign=True)), PATH, SIGNER)
    assert report.lines == 3


def test_a_line_nested_beyond_the_parser_is_named_not_a_recursion_error() -> None:
    good = _ledger(_bodies(), rehash=False, sign=False).split(b"\n")[0]
    parsed = parse_ledger_bytes(good + b"\n" + b"[" * 100_000 + b"]" * 100_000 + b"\n")
    assert parsed.bad is not None and parsed.bad[0] == 2 and len(parsed.lines) == 1
