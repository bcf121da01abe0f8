"""Peer-supplied text never forges a log line nor floods the log; Join fields are bounded.

On main a newline in a key of the config view a participant sends in Join forged a log line
on the coordinator, and a 3 MiB ``software_version`` was logged whole.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from lensemble import __version__
from lensemble.config import config_hash
from lensemble.config.hashing import canonical_json, hashed_view
from lensemble.config.load import validate_mapping
from lensemble.network.coordinator.transport import GrpcCoordinatorTransport
from lensemble.network.shared import logs
from lensemble.network.shared.peer_text import (
    JOIN_LIMITS,
    MAX_SHOWN_CHARS,
    one_line,
    oversized_field,
    shown,
    shown_all,
)

FORGED = "\n12:00:00 INFO [coordinator] mallory joined at round 0."


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("plain text", "plain text"),
        ("a\nb\rc\td", "a\\nb\\rc\\td"),
        ("\x1b[31mred", "\\x1b[31mred"),
        ("left\u202eright", "left\\u202eright"),  # bidirectional override
        ("line\u2028separator", "line\\u2028separator"),
        ("back\\slash", "back\\\\slash"),
        (b"bytes\n\xff", "bytes\\n\ufffd"),
    ],
)
def test_shown_escapes_everything_that_could_break_or_fake_a_line(
    raw: str | bytes, expected: str
) -> None:
    assert shown(raw) == expected


def test_shown_caps_a_huge_value_and_says_how_much_is_left_out() -> None:
    huge = "v" * (3 << 20)
    text = shown(huge)
    assert text.startswith("v" * MAX_SHOWN_CHARS)
    assert text.endswith(f"...[{len(huge) - MAX_SHOWN_CHARS} more]")
    assert len(text) < MAX_SHOWN_CHARS + 30
    escapes = shown("\n" * 1000, limit=10)
    assert escapes == "\\n" * 5 + "...[995 more]"
    assert len(shown(b"\x00" * (1 << 20))) < MAX_SHOWN_CHARS + 40


def test_shown_all_caps_the_number_of_items() -> None:
    assert shown_all(["a\nb"] * 3, items=2) == ["a\\nb", "a\\nb", "...[1 more]"]


def test_one_line_leaves_printable_text_alone() -> None:
    assert one_line("round 3 committed sha256:ab…") == "round 3 committed sha256:ab…"
    assert "\n" not in one_line(FORGED)


def test_oversized_field_names_the_field_and_its_bound() -> None:
    fields = {"participant_id": "alpha", "software_version": "9" * 65}
    message = oversized_field(fields, JOIN_LIMITS)
    assert message is not None and "software_version has 65 characters" in message
    assert oversized_field({"participant_id": "alpha"}, JOIN_LIMITS) is None


@pytest.fixture
def text_log() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.TextFormatter("coordinator"))
    root = logging.getLogger(logs.ROOT_LOGGER)
    saved = (root.handlers[:], root.level, root.propagate)
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False
    yield stream
    root.handlers[:], root.level, root.propagate = saved


def _transport() -> GrpcCoordinatorTransport:
    config = validate_mapping(
        {"federation": {"participants": [{"id": "alpha"}, {"id": "bravo"}], "quorum": 1}}
    )
    return GrpcCoordinatorTransport(config, next_round=0)


def test_a_newline_in_a_config_view_key_does_not_forge_a_coordinator_log_line(
    text_log: io.StringIO,
) -> None:
    transport = _transport()
    view: dict[str, Any] = hashed_view(transport.config)
    view["federation"][f"rounds{FORGED}"] = 1
    outcome = transport.join("alpha", "sha256-canon-v1:" + "0" * 64, json.dumps(view), "x")
    assert not outcome.accepted
    lines = text_log.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert "refused alpha" in lines[0] and "mallory joined" in lines[0]  # shown, escaped


def test_a_3_mib_software_version_is_logged_capped(text_log: io.StringIO) -> None:
    transport = _transport()
    version = "1." + "9" * (3 << 20)
    view = canonical_json(hashed_view(transport.config)).decode()
    outcome = transport.join("alpha", config_hash(transport.config), view, version)
    assert outcome.accepted
    logged = text_log.getvalue()
    assert __version__ in logged and "more]" in logged
    assert len(logged) < 2000


def test_a_leave_reason_is_escaped_and_capped(text_log: io.StringIO) -> None:
    transport = _transport()
    transport.leave("alpha", FORGED + "x" * 100_000)
    lines = text_log.getvalue().splitlines()
    assert len(lines) == 1 and len(lines[0]) < 400


def test_a_view_nested_beyond_the_parser_depth_is_just_unreadable() -> None:
    transport = _transport()
    outcome = transport.join("alpha", "sha256-canon-v1:" + "1" * 64, "[" * 100_000, "x")
    assert not outcome.accepted and outcome.differing == []


def test_the_json_log_stays_one_line_per_event_with_capped_fields() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter({"role": "coordinator"}))
    root = logging.getLogger(logs.ROOT_LOGGER)
    saved = (root.handlers[:], root.level, root.propagate)
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    try:
        transport = _transport()
        view: dict[str, Any] = hashed_view(transport.config)
        for i in range(100):
            view["federation"][f"k{i}{FORGED}{'z' * 10_000}"] = i
        transport.join("alpha", "sha256-canon-v1:" + "0" * 64, json.dumps(view), "x")
    finally:
        root.handlers[:], root.level, root.propagate = saved
    (line,) = stream.getvalue().splitlines()
    record = json.loads(line)
    assert len(record["differing"]) <= 21 and record["differing"][-1].endswith("more]")
    # Bounded by the caps (twenty items, in the message and the field), not by the 1 MB sent.
    assert len(line) < 2 * 21 * (MAX_SHOWN_CHARS + 40) + 2000
