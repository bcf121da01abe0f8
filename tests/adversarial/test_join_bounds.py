"""Join's fields are bounded on a live server: an oversized field is refused before anything
reads it, with a reason the participant can tell apart (real gRPC over mutual TLS)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from lensemble import __version__
from lensemble.config import config_hash
from lensemble.config.hashing import canonical_json, hashed_view
from lensemble.federation.coordinator import global_architecture
from lensemble.network.coordinator.authenticator import Authenticator
from lensemble.network.coordinator.server import start_coordinator_server
from lensemble.network.coordinator.transport import GrpcCoordinatorTransport
from lensemble.network.participant.call_errors import classify
from lensemble.network.participant.client import CoordinatorClient
from lensemble.network.shared.identity import PARTICIPANT_KEY
from lensemble.network.shared.peer_text import JOIN_LIMITS
from lensemble.network.shared.proto import lensemble_pb2 as pb
from lensemble.network.shared.security import server_credentials
from tests.support.federation import initial_params
from tests.support.network import network_mapping, write_config

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("field", sorted(JOIN_LIMITS))
def test_an_oversized_join_field_is_refused_and_counted(tmp_path: Path, field: str) -> None:
    _, config = write_config(tmp_path, network_mapping(tmp_path))
    transport = GrpcCoordinatorTransport(config, next_round=0)
    server, _ = start_coordinator_server(
        transport,
        Authenticator(config, config.participant_ids),
        server_credentials(config),
        host="127.0.0.1",
        port=config.network.port,
        architecture=global_architecture(initial_params(config.run.root_seed)),
    )
    pid = config.participant_ids[0]
    client = CoordinatorClient(config, pid)
    request = {
        "participant_id": pid,
        "config_hash": config_hash(config),
        "config_view_json": canonical_json(hashed_view(config)).decode(),
        "software_version": __version__,
    }
    request[field] = "x" * (JOIN_LIMITS[field] + 1)
    try:
        with pytest.raises(grpc.RpcError) as caught:
            client.stub.Join(
                pb.JoinRequest(**request), timeout=10, metadata=((PARTICIPANT_KEY, pid),)
            )
        error = classify(caught.value)
        assert error.reason == "oversized_field"
        assert f"field {field} has {JOIN_LIMITS[field] + 1} characters" in error.message
        refused = transport.metrics.refused_calls.labels(rpc="Join", reason="oversized_field")
        assert refused._value.get() == 1
        # The same participant with well-formed fields is welcome.
        assert client.join().accepted
    finally:
        client.close()
        server.stop(None)
