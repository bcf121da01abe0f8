"""Checkpoints and resume: an interrupted run continues to the same hash chain."""

from __future__ import annotations

from pathlib import Path

import pytest

from lensemble.errors import ConfigError, IntegrityError
from lensemble.federation.checkpoint import CheckpointStore
from lensemble.federation.ledger import Ledger, committed_chain
from lensemble.federation.participant import verify_model_payload
from tests.support.federation import build, small_config


def _uninterrupted(tmp_path: Path, rounds: int = 4) -> list[str]:
    config = small_config(rounds=rounds)
    coordinator, transport, _ = build(config, output_dir=tmp_path / "straight")
    coordinator.run(transport)
    return committed_chain(Ledger(tmp_path / "straight" / "ledger.jsonl").records())


def test_resume_after_interruption_gives_the_same_chain(tmp_path: Path) -> None:
    config = small_config(rounds=4)
    out = tmp_path / "resumed"
    coordinator, transport, _ = build(config, output_dir=out)
    coordinator.run_round(transport)
    coordinator.run_round(transport)
    # The process dies here; a new one resumes from the output folder.
    resumed, transport2, participants = build(config, output_dir=out, resume=True)
    assert resumed.version == 2
    assert all(p.learner.rounds_trained == [] for p in participants.values())
    resumed.run(transport2)
    assert committed_chain(Ledger(out / "ledger.jsonl").records()) == _uninterrupted(tmp_path)
    # Outer momentum was restored too: the chain would differ otherwise (checked above).


def test_resume_restores_a_ledger_line_lost_in_a_crash(tmp_path: Path) -> None:
    config = small_config(rounds=3)
    out = tmp_path / "run"
    coordinator, transport, _ = build(config, output_dir=out)
    coordinator.run_round(transport)
    coordinator.run_round(transport)
    ledger = out / "ledger.jsonl"
    lines = ledger.read_text().splitlines()
    ledger.write_text(lines[0] + "\n")  # crash after the checkpoint, before the ledger append
    resumed, transport2, _ = build(config, output_dir=out, resume=True)
    resumed.run(transport2)
    assert committed_chain(Ledger(ledger).records()) == _uninterrupted(tmp_path, rounds=3)


def test_a_deleted_newest_checkpoint_is_refused_before_any_work(tmp_path: Path) -> None:
    config = small_config(rounds=2)
    out = tmp_path / "run"
    coordinator, transport, _ = build(config, output_dir=out)
    coordinator.run(transport)
    store = CheckpointStore(out)
    # The checkpoint is durable before its ledger line: no crash can lose it, only an edit.
    (store.folder / "model-v000002.safetensors").unlink()
    with pytest.raises(IntegrityError, match="lacks the checkpoint of the last committed round"):
        build(config, output_dir=out, resume=True)
    assert [r.round for r in Ledger(out / "ledger.jsonl").records()] == [0, 1]  # untouched
    for path in store.folder.iterdir():
        path.unlink()
    with pytest.raises(IntegrityError, match="holds no checkpoint, but the ledger commits"):
        build(config, output_dir=out, resume=True)


def test_tampered_checkpoint_fails_closed(tmp_path: Path) -> None:
    config = small_config(rounds=1)
    coordinator, transport, _ = build(config, output_dir=tmp_path)
    coordinator.run(transport)
    path = CheckpointStore(tmp_path).folder / "model-v000001.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="does not match its recorded model hash"):
        build(config, output_dir=tmp_path, resume=True)


def test_resume_with_another_config_is_refused_naming_the_fields(tmp_path: Path) -> None:
    coordinator, transport, _ = build(small_config(rounds=1), output_dir=tmp_path)
    coordinator.run(transport)
    with pytest.raises(ConfigError, match=r"differing: federation.inner_steps, federation.quorum"):
        build(small_config(rounds=1, inner_steps=5, quorum=2), output_dir=tmp_path, resume=True)


def test_resume_may_run_longer(tmp_path: Path) -> None:
    out = tmp_path / "longer"
    coordinator, transport, _ = build(small_config(rounds=2), output_dir=out)
    coordinator.run(transport)
    resumed, transport2, _ = build(small_config(rounds=4), output_dir=out, resume=True)
    resumed.run(transport2)
    assert committed_chain(Ledger(out / "ledger.jsonl").records()) == _uninterrupted(tmp_path)


def test_participant_refuses_a_tampered_model(tmp_path: Path) -> None:
    coordinator, _, _ = build(small_config())
    payload = bytearray(coordinator.model_payload())
    payload[-1] ^= 0x01
    with pytest.raises(IntegrityError, match="refusing to train"):
        verify_model_payload(bytes(payload), coordinator.model_hash)
    with pytest.raises(IntegrityError, match="unusable"):
        verify_model_payload(b"garbage", coordinator.model_hash)


def test_participants_rewind_when_a_restarted_coordinator_reopens_a_round(
    tmp_path: Path,
) -> None:
    from lensemble.federation.coordinator import Coordinator
    from lensemble.federation.messages import RoundOpening
    from tests.support.federation import initial_params

    config = small_config(rounds=3)
    out = tmp_path / "crashy"
    coordinator, transport, participants = build(config, output_dir=out)
    coordinator.run_round(transport)
    # Round 1 opens and every participant trains and submits; the coordinator dies before
    # committing (nothing of round 1 reached its checkpoint).
    opening = RoundOpening(1, 0, 1, coordinator.model_hash, 30.0)
    transport.open_round(opening, coordinator.model_payload())
    # The restarted coordinator resumes at version 1 and reopens round 1; the participant
    # processes kept running (their inner state already includes round 1's training).
    restarted = Coordinator(config, initial_params(3), output_dir=out, resume=True)
    assert restarted.version == 1
    restarted.run(type(transport)(participants))
    assert committed_chain(Ledger(out / "ledger.jsonl").records()) == _uninterrupted(
        tmp_path, rounds=3
    )


def _chain_with_alpha_training_in_vain(tmp_path: Path, *, forget: bool) -> list[str]:
    """Round 1: alpha trains but its update never arrives; the coordinator goes on without it."""
    from lensemble.federation.faults import parse_faults
    from lensemble.federation.messages import RoundOpening

    config = small_config(rounds=3)
    out = tmp_path / ("forgot" if forget else "kept")
    coordinator, transport, participants = build(
        config, faults=parse_faults("drop:alpha@1"), output_dir=out
    )
    coordinator.run_round(transport)
    opening = RoundOpening(1, 0, 1, coordinator.model_hash, 30.0)
    participants["alpha"].contribute(opening, coordinator.model_payload())
    if forget:
        assert participants["alpha"].forget(1, 0)
        assert not participants["alpha"].forget(1, 0)  # once: nothing left to undo
    coordinator.run(transport)
    return committed_chain(Ledger(out / "ledger.jsonl").records())


def test_a_participant_whose_update_was_lost_trains_on_as_if_absent(tmp_path: Path) -> None:
    from lensemble.federation.faults import parse_faults

    config = small_config(rounds=3)
    coordinator, transport, _ = build(
        config, faults=parse_faults("drop:alpha@1"), output_dir=tmp_path / "dropped"
    )
    coordinator.run(transport)
    absent = committed_chain(Ledger(tmp_path / "dropped" / "ledger.jsonl").records())
    assert _chain_with_alpha_training_in_vain(tmp_path, forget=True) == absent
    # Without the rewind, the training in vain leaks into alpha's later updates.
    kept = _chain_with_alpha_training_in_vain(tmp_path, forget=False)
    assert kept[:2] == absent[:2] and kept[2] != absent[2]


@pytest.mark.parametrize("damage", ["truncated", "garbled-header"])
def test_a_corrupt_inner_state_file_is_named_with_the_fix(tmp_path: Path, damage: str) -> None:
    # Issue 41, item 17: the error was the payload parser's, naming neither file nor fix.
    config = small_config(rounds=3)
    out = tmp_path / "run"
    coordinator, transport, _ = build(config, output_dir=out)
    coordinator.run_round(transport)
    coordinator.run_round(transport)
    state = sorted((out / "participants" / "alpha" / "state").iterdir())[-1]
    data = state.read_bytes()
    state.write_bytes(
        data[: len(data) // 2] if damage == "truncated" else data[:8] + b"{x" + data[10:]
    )
    with pytest.raises(IntegrityError) as refused:
        build(config, output_dir=out, resume=True)
    assert str(state) in refused.value.message
    assert f"delete {state}" in refused.value.remediation
