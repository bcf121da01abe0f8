"""The gRPC service of lensemble.proto (tests/test_generated.py keeps the stubs fresh)."""

from __future__ import annotations


def test_service_has_the_contracted_rpcs() -> None:
    from lensemble.network.shared.proto import lensemble_pb2 as pb

    service = pb.DESCRIPTOR.services_by_name["Coordinator"]
    assert service.full_name == "lensemble.v1.Coordinator"
    kinds = {m.name: (m.client_streaming, m.server_streaming) for m in service.methods}
    assert kinds == {
        "Join": (False, False),
        "WatchRounds": (False, True),
        "FetchModel": (False, True),
        "SubmitUpdate": (True, False),
        "Leave": (False, False),
        "Presence": (False, True),
        "Abstain": (False, False),
        "MaskingStages": (False, True),
        "AnswerStage": (True, False),
    }
