"""Commits written behind: the next round opens while the previous one is made durable."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from lensemble.durable import DiskFull
from lensemble.federation.checkpoint import CheckpointStore, CoordinatorCheckpoint
from lensemble.federation.coordinator import Coordinator
from lensemble.federation.ledger import Ledger, RoundRecord
from lensemble.federation.verify import verify_run
from tests.support.federation import build, small_config


class _Seen:
    """An observer noting, for each announced round, what the ledger held at that moment."""

    def __init__(self, ledger: Path) -> None:
        self.ledger = ledger
        self.rounds: list[tuple[int, list[int], str]] = []

    def on_state(self, round_index: int, attempt: int, state: object) -> None:
        pass

    def on_verdict(self, submission: object, verdict: object) -> None:
        pass

    def on_round(self, record: RoundRecord) -> None:
        lines = [r.round for r in Ledger(self.ledger).records()]
        self.rounds.append((record.round, lines, threading.current_thread().name))


def test_each_round_is_announced_once_its_line_is_durable(tmp_path: Path) -> None:
    coordinator, transport, _ = build(small_config(rounds=3), output_dir=tmp_path)
    seen = _Seen(tmp_path / "ledger.jsonl")
    coordinator.observer = seen
    summary = coordinator.run(transport)
    assert [r for r, _, _ in seen.rounds] == [0, 1, 2]
    for round_index, lines, _ in seen.rounds:
        assert lines == list(range(round_index + 1))  # its own line is there, nothing later
    assert any(name.startswith("lensemble-commit") for _, _, name in seen.rounds)
    assert [r.round for r in summary.records] == [0, 1, 2]
    assert verify_run(tmp_path).ok


def test_a_commit_that_fails_behind_stops_the_run_with_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save = CheckpointStore.save

    def full_at_version_2(self: CheckpointStore, ckpt: CoordinatorCheckpoint) -> str:
        if ckpt.version == 2:
            raise DiskFull(f"no space left in {self.folder}: 0 B free;")
        return save(self, ckpt)

    monkeypatch.setattr(CheckpointStore, "save", full_at_version_2)
    coordinator, transport, _ = build(small_config(rounds=3), output_dir=tmp_path)
    seen = _Seen(tmp_path / "ledger.jsonl")
    coordinator.observer = seen
    with pytest.raises(DiskFull, match="no space left"):
        coordinator.run(transport)
    assert [r.round for r in Ledger(tmp_path / "ledger.jsonl").records()] == [0]
    assert [r for r, _, _ in seen.rounds] == [0]  # round 1 was never announced
    assert CheckpointStore(tmp_path).versions() == [0, 1]
    monkeypatch.undo()
    resumed, transport2, _ = build(small_config(rounds=3), output_dir=tmp_path, resume=True)
    assert isinstance(resumed, Coordinator) and resumed.version == 1
    reference, reference_transport, _ = build(small_config(rounds=3), output_dir=tmp_path / "ref")
    assert resumed.run(transport2).model_hash == reference.run(reference_transport).model_hash
