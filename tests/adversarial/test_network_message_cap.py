"""Issues 12.5 and 15.4: the payload cap follows the model, and an impossible one never starts.

On main the default cap was 512 MiB for a model of kilobytes, and ``max_message_bytes=20000``
with a 48,448-byte model validated, ran, and ended with "excluded ... timeout". Now the cap is
derived from the model's wire size (a config may only lower it), a cap below that size stops
every process at start with exit 2 naming the field, the size needed and the fix, and an
oversized upload is refused as ``too_large`` at once, which the ledger records as its cause.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest

from lensemble.errors import EXIT_BAD_INPUT
from lensemble.federation.payload import manifest
from lensemble.network.participant.client import CoordinatorClient
from lensemble.network.shared.payload_limits import payload_limits
from lensemble.network.shared.proto import lensemble_pb2 as pb
from lensemble.network.shared.transport_errors import REASON_KEY
from tests.support.federation import initial_params
from tests.support.network import federation, ledger, network_mapping, write_config

pytestmark = pytest.mark.slow
START_S = 90.0  # process start-up on a loaded 2-core machine (torch import)


def test_a_cap_below_the_models_wire_size_stops_every_process_at_start(tmp_path: Path) -> None:
    mapping = network_mapping(tmp_path, rounds=1)
    mapping["network"]["max_message_bytes"] = 20000
    path, config = write_config(tmp_path, mapping)
    needed = payload_limits(
        config.model_copy(
            update={"network": config.network.model_copy(update={"max_message_bytes": None})}
        ),
        manifest(initial_params(config.run.root_seed)),
    ).needed_bytes
    assert needed > 20000
    with federation(tmp_path, path) as fed:
        procs = [fed.start_coordinator(), fed.start_participant("alpha")]
        for proc in procs:
            assert proc.wait(START_S) == EXIT_BAD_INPUT
            message = proc.last_error()
            assert "network.max_message_bytes" in message, message
            assert f"{needed} bytes" in message and "20000" in message, message
            assert "unset it" in message, message
            assert "Traceback" not in proc.log_path.read_text(encoding="utf-8")
    assert not (Path(config.run.output_dir) / "checkpoints").exists() or not any(
        (Path(config.run.output_dir) / "checkpoints").iterdir()
    )


def test_an_oversized_upload_is_refused_at_once_and_the_ledger_names_it(tmp_path: Path) -> None:
    mapping = network_mapping(tmp_path, rounds=1, round_timeout_s=60)
    path, config = write_config(tmp_path, mapping)
    cap = payload_limits(config, manifest(initial_params(config.run.root_seed))).update_bytes
    with federation(tmp_path, path) as fed:
        coordinator = fed.start_coordinator()
        honest = [fed.start_participant(pid) for pid in ("bravo", "charlie", "delta")]
        coordinator.wait_ready(START_S)
        client = CoordinatorClient(config, "alpha")  # alpha's own certificate: authenticated
        present = threading.Event()
        try:
            assert client.join().accepted
            # Present like a real participant, so the round waits for alpha's verdict.
            threading.Thread(target=client.hold_presence, args=(present,), daemon=True).start()
            announcement = client.watch((-1, 1 << 30))
            assert announcement is not None and announcement.round_index == 0
            header = pb.UpdateHeader(
                participant_id="alpha",
                session=client.session,
                round_index=0,
                attempt=0,
                payload_hash="sha256:" + "0" * 64,
                quantization=config.federation.quantization,
                total_bytes=cap + 1,
            )
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as caught:
                client.stub.SubmitUpdate(
                    iter([pb.UpdateChunk(header=header, data=b"\0" * 1024)]),
                    timeout=30,
                    metadata=client.metadata,
                )
            refused_in_s = time.monotonic() - started
        finally:
            present.set()
            client.close()
        error = caught.value
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert dict(error.trailing_metadata() or ())[REASON_KEY] == "too_large"
        assert f"{cap + 1} bytes" in (error.details() or "")
        assert refused_in_s < config.network.rpc_timeout_s
        assert coordinator.wait(START_S) == 0
        assert [p.wait(30) for p in honest] == [0, 0, 0]
    (record,) = ledger(config)
    assert record.state == "closed" and record.contributors == ["bravo", "charlie", "delta"]
    # The real cause, not "timeout"; and the round did not wait for its 60 s deadline.
    assert record.excluded == {"alpha": "too_large"}
    assert record.wall_s < 30
