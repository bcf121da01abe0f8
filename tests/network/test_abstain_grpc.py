"""``Abstain`` over real gRPC with mutual TLS: through the call guard, refusals keep their status
and reason in the trailing metadata, and a valid abstention is recorded (integration tier)."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from lensemble.federation.coordinator import global_architecture
from lensemble.federation.messages import RoundOpening
from lensemble.network.coordinator.authenticator import Authenticator
from lensemble.network.coordinator.server import start_coordinator_server
from lensemble.network.coordinator.transport import GrpcCoordinatorTransport
from lensemble.network.participant.call_errors import Failure, classify
from lensemble.network.participant.client import CoordinatorClient
from lensemble.network.shared.identity import PARTICIPANT_KEY
from lensemble.network.shared.proto import lensemble_pb2 as pb
from lensemble.network.shared.security import server_credentials
from tests.support.federation import initial_params
from tests.support.network import network_mapping, write_config


def test_abstain_over_mtls_refuses_hostile_calls_and_records_a_valid_one(tmp_path: Path) -> None:
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
    client = CoordinatorClient(config, "alpha")
    try:
        assert client.join().accepted
        opening = RoundOpening(0, 0, 0, "sha256:" + "0" * 64, time.monotonic() + 60)
        transport.open_round(opening, b"model")

        def refused(request: pb.AbstainRequest) -> tuple[grpc.StatusCode, str]:
            with pytest.raises(grpc.RpcError) as caught:
                client.stub.Abstain(request, timeout=10, metadata=((PARTICIPANT_KEY, "alpha"),))
            return caught.value.code(), classify(caught.value).reason

        fields = {"participant_id": "alpha", "session": client.session, "round_index": 0}
        assert refused(
            pb.AbstainRequest(**{**fields, "participant_id": "bravo"}, reason="rank_failure")
        ) == (
            grpc.StatusCode.PERMISSION_DENIED,
            "bad_credentials",
        )
        assert refused(pb.AbstainRequest(**fields, reason="timeout")) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "unknown_abstention",
        )
        assert refused(pb.AbstainRequest(**fields, attempt=3, reason="rank_failure")) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "closed_round",
        )
        assert "alpha" not in transport.absence_reasons()  # the others never joined
        assert client.abstain(opening, "rank_failure").outcome == "abstained"
        assert client.abstain(opening, "rank_failure").outcome == "duplicate"
        assert transport.absence_reasons()["alpha"] == "rank_failure"
        # An update for the attempt it sat out is refused (at its header, before buffering).
        error = classify(_submit_error(client, opening))
        assert (error.kind, error.reason) == (Failure.ROUND_LOST, "abstained")
    finally:
        client.close()
        server.stop(None)


def _submit_error(client: CoordinatorClient, opening: RoundOpening) -> grpc.RpcError:
    from lensemble.federation.participant import Contribution
    from lensemble.federation.payload import bytes_hash

    contribution = Contribution(b"payload", bytes_hash(b"payload"), 0.0, 0.0)
    with pytest.raises(grpc.RpcError) as caught:
        client.submit(opening, contribution)
    return caught.value
