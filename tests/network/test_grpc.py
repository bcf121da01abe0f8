"""The gRPC transport end to end inside one process: parity, config refusal, credentials."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from lensemble.config.load import validate_mapping
from lensemble.errors import EXIT_FAIL_CLOSED, ConfigError
from lensemble.federation import spool as spool_module
from lensemble.federation.coordinator import Coordinator
from lensemble.federation.intake import Landing
from lensemble.federation.ledger import committed_chain
from lensemble.federation.participant import Participant
from lensemble.federation.payload import manifest
from lensemble.federation.spool import UpdateSpool
from lensemble.network.participant.client import CoordinatorClient
from lensemble.network.participant.loop import ParticipantLoop
from lensemble.network.shared import streams
from lensemble.network.shared.transport_errors import BUSY, AccessDenied
from tests.support.federation import PARTICIPANTS, QuadraticLearner, build, initial_params
from tests.support.network import (
    LiveCoordinator,
    ParticipantThread,
    network_mapping,
    write_config,
)


def _in_process_chain(mapping: dict[str, Any]) -> list[str]:
    in_process = dict(mapping, federation={**mapping["federation"], "transport": "in_process"})
    coordinator, transport, _ = build(validate_mapping(in_process))
    return committed_chain(coordinator.run(transport).records)


def _run_all(config: Any, tokens: dict[str, str] | None = None) -> Any:
    with LiveCoordinator(config) as live:
        threads = [
            ParticipantThread(config, pid, token=(tokens or {}).get(pid)) for pid in PARTICIPANTS
        ]
        live.thread.join(60)
        for t in threads:
            t.thread.join(30)
            t.close()
        assert live.error is None, live.error
        assert all(t.error is None for t in threads), [t.error for t in threads]
        assert all(not t.thread.is_alive() for t in threads)  # every one saw the end and left
        assert live.transport.all_left()
    return live


def test_mtls_run_commits_the_in_process_hash_chain(tmp_path: Path) -> None:
    mapping = network_mapping(tmp_path, rounds=3)
    _, config = write_config(tmp_path, mapping)
    live = _run_all(config)
    assert committed_chain(live.result.records) == _in_process_chain(mapping)
    # Bytes are the transport's own counts: four fetches of the round-0 model.
    theta0_payload = Coordinator(config, initial_params(config.run.root_seed)).model_payload()
    assert live.result.records[0].bytes_down == 4 * len(theta0_payload)
    assert live.metrics.accepted._value.get() == 12
    assert live.metrics.bytes_out._value.get() == sum(r.bytes_down for r in live.result.records)
    # The design's round metrics follow the ledger.
    registry = live.metrics.registry
    assert registry.get_sample_value("lensemble_model_version") == 3
    assert registry.get_sample_value("lensemble_rounds_total", {"state": "closed"}) == 3
    assert registry.get_sample_value("lensemble_serialize_seconds_count") == 3
    assert registry.get_sample_value("lensemble_submission_deadline_margin_seconds_count") == 12
    for pid in PARTICIPANTS:
        labels = {"participant": pid}
        assert registry.get_sample_value("lensemble_participant_missed_rounds", labels) == 0
        assert registry.get_sample_value(
            "lensemble_participant_last_seen_timestamp_seconds", labels
        )
    last = live.result.records[-1]
    down = {"direction": "down", "quantization": last.quantization}
    assert registry.get_sample_value("lensemble_round_payload_bytes", down) == last.bytes_down


@pytest.mark.parametrize("disk", ["fine", "full once"])
def test_updates_landed_in_the_spool_commit_the_same_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, disk: str
) -> None:
    # Every update stream lands in a spool file (the test model's payloads are far below the
    # 1 MiB a stream needs to land, and small enough to be held in memory): on tmpfs, which
    # always makes unnamed files.
    monkeypatch.setattr(streams, "LARGE", 1)
    monkeypatch.setattr(spool_module, "MEMORY_PAYLOAD_BYTES", 0)
    failed: list[str] = []
    if disk == "full once":  # the coordinator's disk, not the sender: refused as busy, resent
        real_write = Landing.write

        def write(self: Landing, piece: Any) -> None:
            if not failed:
                failed.append("ENOSPC")
                raise OSError(errno.ENOSPC, "No space left on device")
            real_write(self, piece)

        monkeypatch.setattr(Landing, "write", write)
    mapping = network_mapping(tmp_path, rounds=3)
    _, config = write_config(tmp_path, mapping)
    state = Path("/dev/shm") / f"lensemble-landing-{os.getpid()}"
    landed: list[int] = []
    real_land = UpdateSpool.land

    def counted(self: UpdateSpool, size: int) -> Landing | None:
        landing = real_land(self, size)
        landed.append(size if landing is not None else -1)
        return landing

    monkeypatch.setattr(UpdateSpool, "land", counted)
    try:
        with LiveCoordinator(config, output_dir=state) as live:
            threads = [ParticipantThread(config, pid) for pid in PARTICIPANTS]
            live.thread.join(60)
            for t in threads:
                t.thread.join(30)
                t.close()
            assert live.error is None, live.error
            assert all(t.error is None for t in threads), [t.error for t in threads]
        # 4 participants x 3 rounds, all landed (and one resent when the disk was full once).
        assert len(landed) == 12 + len(failed) and min(landed) > 0
        assert committed_chain(live.result.records) == _in_process_chain(mapping)
        assert all(len(r.updates) == 4 and not r.excluded for r in live.result.records)
        assert live.metrics.rejected.labels(reason=BUSY)._value.get() == len(failed)
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_token_auth_run_commits_the_same_chain_and_refuses_a_wrong_token(tmp_path: Path) -> None:
    mapping = network_mapping(tmp_path, rounds=2)
    tokens = {pid: f"{pid}-token-{'x' * 24}" for pid in PARTICIPANTS}
    folder = tmp_path / "tokens"
    folder.mkdir()
    (folder / "coordinator").write_text("".join(f"{p} {t}\n" for p, t in tokens.items()))
    mapping["network"].update(auth="token", token_file=str(folder / "{identity}"))
    mapping["network"]["tls"]["client_auth"] = False
    _, config = write_config(tmp_path, mapping)
    live = _run_all(config, tokens)
    assert committed_chain(live.result.records) == _in_process_chain(mapping)
    with LiveCoordinator(config):
        client = CoordinatorClient(config, "alpha", token=tokens["bravo"])
        loop = ParticipantLoop(config, _participant(config, "alpha"), client)
        with pytest.raises(AccessDenied, match="not the token of participant 'alpha'") as info:
            loop.join()
        assert info.value.exit_code == EXIT_FAIL_CLOSED
        client.close()


def _participant(config: Any, pid: str) -> Participant:
    theta0 = initial_params(config.run.root_seed)
    return Participant(config, pid, QuadraticLearner(pid), manifest(theta0))


def test_a_certificate_for_one_participant_cannot_act_as_another(tmp_path: Path) -> None:
    mapping = network_mapping(tmp_path, rounds=1)
    _, config = write_config(tmp_path, mapping)
    stolen = dict(mapping)
    stolen["network"] = {
        **mapping["network"],
        "tls": {
            **mapping["network"]["tls"],
            "cert_file": str(tmp_path / "certs" / "alpha" / "tls.crt"),
            "key_file": str(tmp_path / "certs" / "alpha" / "tls.key"),
        },
    }
    thief_config = validate_mapping(stolen)
    with LiveCoordinator(config) as live:
        client = CoordinatorClient(thief_config, "bravo")
        loop = ParticipantLoop(thief_config, _participant(thief_config, "bravo"), client)
        with pytest.raises(AccessDenied, match=r"certificate \(alpha\) does not identify"):
            loop.join()
        client.close()
        refused = live.metrics.refused_calls.labels(rpc="Join", reason="bad_credentials")
        assert refused._value.get() == 1
        assert "bravo" not in live.transport._liveness._joined


def test_join_with_another_config_is_refused_naming_the_fields(tmp_path: Path) -> None:
    mapping = network_mapping(tmp_path, rounds=1)
    _, config = write_config(tmp_path, mapping)
    other = dict(mapping, federation={**mapping["federation"], "inner_steps": 3})
    other["model"] = {"latent_dim": 8}
    other_config = validate_mapping(other)
    with LiveCoordinator(config) as live:
        client = CoordinatorClient(other_config, "alpha")
        loop = ParticipantLoop(other_config, _participant(other_config, "alpha"), client)
        with pytest.raises(ConfigError) as info:
            loop.join()
        client.close()
        assert [p.path for p in info.value.problems] == [
            "federation.inner_steps",
            "model.latent_dim",
        ]
        assert "lensemble config diff" in str(info.value)
        refused = live.metrics.refused_calls.labels(rpc="Join", reason="config_mismatch")
        assert refused._value.get() == 1
