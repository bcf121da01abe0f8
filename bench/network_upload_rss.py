"""Coordinator memory for one hostile upload, and the assembler's peak memory per payload byte.

Two measurements (issue 12.5), each in fresh processes:

1. ``coordinator``: a real coordinator process (``tests.support.netproc``, mTLS, the quadratic
   test model) is sent one update by an authenticated participant declaring 512 MiB; if the
   coordinator refuses that size, the largest size it accepts is sent instead. Reported: the
   coordinator's resident set (``VmRSS``) and peak (``VmHWM``) before and after.
2. ``assembler``: a child process assembles a payload of ``--mib`` MiB from 1 MiB chunks with
   ``lensemble.network.shared.streams.Assembler``; reported: its peak RSS growth / payload size
   (2.0 = one extra full copy, 1.0 = none).

Run from the repository root: ``python bench/network_upload_rss.py [--mib 256]``. The same script
runs against another checkout's code with ``PYTHONPATH=<checkout>/runtime:<checkout>``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MiB = 1024 * 1024
HOSTILE_BYTES = 512 * MiB


def _status(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


def coordinator() -> None:
    import grpc

    from lensemble.network.participant.client import CoordinatorClient
    from lensemble.network.shared.proto import lensemble_pb2 as pb

    # tests.support lives in the repository, which is not on the path of a script in bench/.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.support.network import federation, network_mapping, write_config

    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        mapping = network_mapping(
            tmp,
            rounds=1,
            round_timeout_s=600,
            join_timeout_s=600,
            participants=[{"id": "alpha"}],
            quorum=1,
        )
        mapping["network"]["rpc_timeout_s"] = 120
        path, config = write_config(tmp, mapping)
        with federation(tmp, path) as fed:
            proc = fed.start_coordinator()
            proc.wait_ready(120)
            client = CoordinatorClient(config, "alpha")
            assert client.join().accepted
            announcement = client.watch((-1, 1 << 30))
            assert announcement is not None
            time.sleep(1.0)
            before = _status(proc.popen.pid)

            def send(total: int) -> str:
                header = pb.UpdateHeader(
                    participant_id="alpha",
                    session=client.session,
                    round_index=0,
                    attempt=0,
                    payload_hash="sha256:" + "0" * 64,
                    quantization=config.federation.quantization,
                    total_bytes=total,
                )
                chunk = b"\0" * config.network.chunk_bytes

                def stream():  # type: ignore[no-untyped-def]
                    sent = 0
                    while sent < total:
                        data = chunk[: min(len(chunk), total - sent)]
                        first = sent == 0
                        sent += len(data)
                        yield (
                            pb.UpdateChunk(header=header, data=data)
                            if first
                            else pb.UpdateChunk(data=data)
                        )

                metadata = (("lensemble-participant", "alpha"),)
                try:
                    client.stub.SubmitUpdate(stream(), timeout=600, metadata=metadata)
                    return "accepted"
                except grpc.RpcError as exc:
                    trailing = dict(exc.trailing_metadata() or ())
                    return f"{exc.code().name} {trailing.get('lensemble-reason')}: {exc.details()}"

            outcome = send(HOSTILE_BYTES)
            sent = HOSTILE_BYTES
            if "too_large" in outcome:
                cap = int(outcome.split("above the ")[1].split("-byte cap")[0])
                print(f"512 MiB upload: {outcome[:90]}...")
                outcome = send(cap)
                sent = cap
            time.sleep(1.0)
            after = _status(proc.popen.pid)
            client.close()
        print(
            f"coordinator, one upload of {sent} bytes ({outcome[:60]}): "
            f"RSS {before['VmRSS'] / MiB:.0f} -> {after['VmRSS'] / MiB:.0f} MiB, "
            f"peak {before['VmHWM'] / MiB:.0f} -> {after['VmHWM'] / MiB:.0f} MiB"
        )


def assembler(mib: int) -> None:
    script = (
        "import resource, sys\n"
        "from lensemble.network.shared.streams import Assembler\n"
        f"n = {mib} * {MiB}\n"
        f"chunk = b'x' * {MiB}\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "a = Assembler(n, n, 'bench')\n"
        f"for _ in range({mib}):\n"
        "    a.add(chunk)\n"
        "payload = a.finish()\n"
        "peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print((peak - base) * 1024 / n)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True)
    ratio = float(out.stdout.decode().strip())
    print(f"assembler, {mib} MiB payload: peak RSS growth {ratio:.2f} x the payload")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--only", choices=["coordinator", "assembler"], default=None)
    args = parser.parse_args()
    if args.only in (None, "assembler"):
        assembler(args.mib)
    if args.only in (None, "coordinator"):
        coordinator()


if __name__ == "__main__":
    main()
