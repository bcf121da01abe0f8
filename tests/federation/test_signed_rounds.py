"""The record of what a participant signed under masking outlives its process, and fails closed."""

from __future__ import annotations

from pathlib import Path

import pytest

from lensemble.errors import IntegrityError
from lensemble.federation.masking import SessionKey
from lensemble.federation.signed_rounds import MAX_BYTES, SignedRounds, record_path

pytestmark = pytest.mark.unit


def test_a_recorded_session_is_read_back_by_a_new_process(tmp_path: Path) -> None:
    path = tmp_path / "state" / "masking-signed.json"
    first = SignedRounds(path)
    assert first.latest is None and first.at_or_after(0) is None
    first.record(SessionKey(4, 1, 2))
    again = SignedRounds(path)  # as a restarted participant reads it
    assert again.latest == SessionKey(4, 1, 2)
    assert again.at_or_after(4) == again.at_or_after(0) == SessionKey(4, 1, 2)
    assert again.at_or_after(5) is None  # the next round is a new one


def test_without_a_file_the_record_is_kept_in_memory_only(tmp_path: Path) -> None:
    signed = SignedRounds()
    signed.record(SessionKey(1, 0, 0))
    assert (
        signed.at_or_after(1) == SessionKey(1, 0, 0) and signed.where() == "this process's memory"
    )
    assert record_path(None) is None
    assert record_path(tmp_path) == tmp_path / "masking-signed.json"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"\xff\xfe",
        b"[1, 2, 3]",
        b'{"round": 1, "attempt": 0}',
        b'{"round": -1, "attempt": 0, "group": 0}',
        b'{"round": true, "attempt": 0, "group": 0}',
        b'{"round": 1.5, "attempt": 0, "group": 0}',
        b" " * (MAX_BYTES + 1),
    ],
)
def test_a_damaged_record_is_refused_naming_the_file(tmp_path: Path, content: bytes) -> None:
    # Treating it as empty would let the participant mask again what it signed.
    path = tmp_path / "masking-signed.json"
    path.write_bytes(content)
    with pytest.raises(IntegrityError) as caught:
        SignedRounds(path)
    assert str(path) in caught.value.message and "new run" in caught.value.remediation
