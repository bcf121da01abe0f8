"""An update stream whose round closes while it arrives is cut off, not received to the end.

Before, the coordinator read every byte of such a stream (3.6 MB in the hostile review) and only
then refused it as ``closed_round``. Now the handler notices the attempt closed at the next chunk
and ends the stream with that status.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from lensemble.federation.payload import bytes_hash, manifest
from lensemble.network.participant.client import CoordinatorClient
from lensemble.network.shared import streams
from lensemble.network.shared.payload_limits import wire_bytes
from lensemble.network.shared.proto import lensemble_pb2 as pb
from lensemble.network.shared.transport_errors import REASON_KEY
from tests.support.federation import initial_params
from tests.support.network import LiveCoordinator, ParticipantThread, network_mapping, write_config

pytestmark = pytest.mark.integration  # a gRPC server on loopback

CHUNK = 1024


def test_an_upload_whose_round_closed_is_cut_off_at_the_next_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mapping = network_mapping(tmp_path, rounds=1, round_timeout_s=5)
    mapping["network"]["chunk_bytes"] = CHUNK
    # A round this short needs a liveness timeout below it (config rule liveness-within-round).
    mapping["network"].update(keepalive_s=1, liveness_timeout_s=3)
    _, config = write_config(tmp_path, mapping)
    after_close: list[int] = []  # bytes the coordinator took in after the attempt closed
    with LiveCoordinator(config) as live:
        board = live.transport._board
        real_add = streams.Assembler.add

        def add(self: streams.Assembler, data: bytes | memoryview) -> None:
            if not board.is_open(0, 0) and "alpha" in self.what:
                after_close.append(len(data))
            real_add(self, data)

        monkeypatch.setattr(streams.Assembler, "add", add)
        honest = [ParticipantThread(config, pid) for pid in ("bravo", "charlie", "delta")]
        alpha = CoordinatorClient(config, "alpha")
        present = threading.Event()
        try:
            assert alpha.join().accepted
            threading.Thread(target=alpha.hold_presence, args=(present,), daemon=True).start()
            announcement = alpha.watch((-1, 1 << 30))
            assert announcement is not None and announcement.round_index == 0
            # The bytes do not matter: the stream's round closes before they are all sent.
            data = os.urandom(60 * CHUNK)  # under the cap: the model's wire size + 64 KiB
            assert len(data) <= wire_bytes(manifest(initial_params(3)))
            closed = threading.Event()

            def stream() -> Iterator[pb.UpdateChunk]:
                header = pb.UpdateHeader(
                    participant_id="alpha",
                    session=alpha.session,
                    round_index=0,
                    attempt=0,
                    payload_hash=bytes_hash(data),
                    quantization="none",
                    total_bytes=len(data),
                )
                yield pb.UpdateChunk(header=header, data=data[:CHUNK])
                closed.wait(60)  # the round closes at its deadline without alpha's update
                for start in range(CHUNK, len(data), CHUNK):
                    yield pb.UpdateChunk(data=data[start : start + CHUNK])

            outcome: list[grpc.RpcError | object] = []

            def upload() -> None:
                try:
                    outcome.append(
                        alpha.stub.SubmitUpdate(stream(), timeout=60, metadata=alpha.metadata)
                    )
                except grpc.RpcError as exc:
                    outcome.append(exc)

            uploading = threading.Thread(target=upload, daemon=True)
            uploading.start()
            live.thread.join(60)
            assert live.error is None and live.result is not None
            assert live.result.records[-1].contributors == ["bravo", "charlie", "delta"]
            closed.set()
            uploading.join(60)
            (error,) = outcome
            assert isinstance(error, grpc.RpcError), error
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert dict(error.trailing_metadata() or ())[REASON_KEY] == "closed_round"
            # At most the chunk in flight when the handler looked, never the rest of the stream.
            assert sum(after_close) <= CHUNK, after_close
        finally:
            present.set()
            alpha.close()
            for participant_thread in honest:
                participant_thread.close()
