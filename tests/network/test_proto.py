"""The committed gRPC stubs are exactly what grpcio-tools generates from lensemble.proto."""

from __future__ import annotations

import shutil
from pathlib import Path

from grpc_tools import protoc

PROTO_DIR = Path("lensemble/network/proto")
GENERATED = ("lensemble_pb2.py", "lensemble_pb2.pyi", "lensemble_pb2_grpc.py")


def test_committed_stubs_match_the_proto(repo: Path, tmp_path: Path) -> None:
    source = repo / "runtime"
    (tmp_path / PROTO_DIR).mkdir(parents=True)
    shutil.copy(source / PROTO_DIR / "lensemble.proto", tmp_path / PROTO_DIR)
    code = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{tmp_path}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            str(tmp_path / PROTO_DIR / "lensemble.proto"),
        ]
    )
    assert code == 0
    stale = [
        name
        for name in GENERATED
        if (tmp_path / PROTO_DIR / name).read_bytes() != (source / PROTO_DIR / name).read_bytes()
    ]
    assert not stale, (
        f"{stale} drifted from lensemble.proto; regenerate with: python -m grpc_tools.protoc "
        "-I runtime --python_out=runtime --pyi_out=runtime --grpc_python_out=runtime "
        "runtime/lensemble/network/proto/lensemble.proto"
    )


def test_service_has_the_contracted_rpcs() -> None:
    from lensemble.network.proto import lensemble_pb2 as pb

    service = pb.DESCRIPTOR.services_by_name["Coordinator"]
    assert service.full_name == "lensemble.v1.Coordinator"
    kinds = {m.name: (m.client_streaming, m.server_streaming) for m in service.methods}
    assert kinds == {
        "Join": (False, False),
        "WatchRounds": (False, True),
        "FetchModel": (False, True),
        "SubmitUpdate": (True, False),
        "Leave": (False, False),
    }
