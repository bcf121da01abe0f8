"""The network transport's cost: round latency and overhead, stream throughput, the chunk size.

Four tables, all measured in the same run on this machine:

0. **Round period** (``--latency 1M``), N = 4, no compute, one coordinator and four participant
   processes on loopback, with mutual TLS and in plaintext: the seconds between two consecutive
   commits (the ledger's ``closed_at``). It covers everything a steady-state round costs: the
   previous round's checkpoint and ledger line (written behind, while this round collects, and
   waited for before it aggregates), the opening and its announcement, every FetchModel
   stream, the participants' decode and hash check, their (no) training, seal, inner-state
   snapshot and hash, every SubmitUpdate stream, validation, reduction, outer step and the new
   model hash. The first round (joining) is left out.
1. **Round non-compute overhead**, N = 4 participants, 10M and 100M float32 parameters, learners
   that do no compute (one scaled copy), so the round is overhead: network transport (one
   coordinator and four participant *processes* on loopback, mutual TLS) against the in-process
   transport with the same config. ``non-compute`` is the ledger's ``wall_s - compute_s``: model
   encode, FetchModel streams, decode and hash checks, pseudo-gradient and seal, SubmitUpdate
   streams, validation, canonical mean, outer step (the ledger's clock stops before the
   checkpoint and the ledger line: table 0 includes them). Median over the rounds.
2. **Throughput on loopback** (MB/s of payload bytes) of the model download (coordinator ->
   participant, ``Down``: over the download port, ``network.download_port``; ``Fetch``: the
   same participant over gRPC FetchModel; each from the call until the whole payload is in one
   buffer) and ``SubmitUpdate``
   (participant -> coordinator: from the call until the verdict of a judge that accepts at once,
   so the coordinator's streaming hash check is included), with and without TLS, against four
   floors measured between the same kind of two processes: a raw TCP socket copy, a raw TLS
   socket copy (Python ``ssl``, mutual auth with the same ECDSA P-256 certificates) of the same
   bytes, the same raw TLS upload with the receiver SHA-256ing every block as it arrives
   (``TLS+h``: what any upload costs that the coordinator must hash, as SubmitUpdate's is), and
   the gRPC floor (grpcio with identity serializers). Every floor receives into a buffer whose
   pages are resident before its clock starts, as Lensemble's recycled payloads are; connection
   set-up and the TLS handshake are outside every clock.
3. **Chunk size** (``network.chunk_bytes``) sweep of both streams over mTLS: the measurement
   behind the default.

    python bench/network_transport.py                  # 10M and 100M (needs ~16 GB RAM)
    python bench/network_transport.py --params 10M     # quicker
    python bench/network_transport.py --params 10M --latency 1M --skip-rounds --skip-chunks

Participant processes run torch with one intra-op thread (four share this machine's cores with
the coordinator, and do no training); the coordinator process always does
(``lensemble.network.launch.process.COORDINATOR_TORCH_THREADS``). Every process keeps freed
buffers in ``malloc`` as the ``lensemble`` command does (:mod:`lensemble.machinery.allocator`).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import mmap
import os
import resource
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
import yaml

from lensemble.config import LensembleConfig
from lensemble.config.load import validate_mapping
from lensemble.federation.coordinator import Coordinator
from lensemble.federation.inprocess import InProcessTransport
from lensemble.federation.ledger import Ledger, RoundRecord
from lensemble.federation.messages import Reason, RoundOpening, Verdict
from lensemble.federation.participant import Contribution, Participant
from lensemble.federation.payload import TensorSpec, bytes_hash, manifest
from lensemble.learner import LocalRound
from lensemble.network.launch.launcher import LocalFederation, free_port
from lensemble.network.shared.certs import init_certs

HERE = Path(__file__).resolve()
IDS = ("p0", "p1", "p2", "p3")
TENSORS = 8
MiB = 1 << 20
#: Where a coordinator process of this bench writes its peak RSS (set by bench/peer_flower.py).
RSS_FILE_ENV = "LENSEMBLE_BENCH_RSS_FILE"


def parse_count(text: str) -> int:
    units = {"K": 10**3, "M": 10**6, "G": 10**9}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def make_params(total: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    size = total // TENSORS
    return {f"layer.{i}.weight": torch.randn(size, generator=g) for i in range(TENSORS)}


class ScaleLearner:
    """No training: local parameters are the global ones scaled by a participant factor."""

    def __init__(self, participant_id: str) -> None:
        self.factor = 1.0 - 1e-3 * (1 + IDS.index(participant_id))

    def train_round(
        self, global_params: Mapping[str, torch.Tensor], round_index: int, steps: int
    ) -> LocalRound:
        return LocalRound({k: v * self.factor for k, v in global_params.items()}, 0.0, 0.0)

    def heldout_loss(self, global_params: Mapping[str, torch.Tensor]) -> None:
        return None

    def inner_state(self) -> dict[str, torch.Tensor]:
        return {}

    def load_inner_state(self, state: Mapping[str, torch.Tensor]) -> None:
        pass


def config_mapping(
    tmp: Path, rounds: int, chunk_bytes: int | None = None, tls: bool = True
) -> dict[str, Any]:
    """The bench's config: N = 4 on loopback; ``chunk_bytes`` None keeps the config default."""
    certs = tmp / "certs"
    mapping: dict[str, Any] = {
        "run": {"name": "bench", "output_dir": str(tmp / "run")},
        "federation": {
            "participants": [{"id": p} for p in IDS],
            "rounds": rounds,
            "inner_steps": 1,
            "quorum": 4,
            "round_timeout_s": 600,
            "join_timeout_s": 900,
            "max_round_retries": 0,
            "transport": "network",
        },
        "network": {
            "port": free_port(),
            "download_port": free_port(),
            "auth": "mtls" if tls else "insecure",
            "tls": {
                "enabled": tls,
                "client_auth": tls,
                "ca_file": str(certs / "ca.crt"),
                "cert_file": str(certs / "{identity}" / "tls.crt"),
                "key_file": str(certs / "{identity}" / "tls.key"),
            },
            "max_message_bytes": 2048 * MiB,
            "rpc_timeout_s": 120,
        },
        "observability": {"log_format": "json"},
    }
    if chunk_bytes is not None:
        mapping["network"]["chunk_bytes"] = chunk_bytes
    return mapping


def write_config(tmp: Path, mapping: dict[str, Any]) -> tuple[Path, LensembleConfig]:
    config = validate_mapping(mapping)
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(mapping), encoding="utf-8")
    init_certs(tmp / "certs", config)
    return path, config


# --------------------------------------------------------------------- 1. round overhead
def network_round(total: int, rounds: int, tls: bool = True) -> list[RoundRecord]:
    """The ledger records of a network run: one coordinator and four participant processes."""
    os.sync()  # start on a quiet disk: an earlier run's writeback would slow this one's fsyncs
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        path, _ = write_config(tmp, config_mapping(tmp, rounds, tls=tls))
        program = [sys.executable, str(HERE), "_proc", "--params", str(total)]
        with LocalFederation(path, [], tmp / "logs", program=program) as fed:
            coordinator = fed.start_coordinator()
            participants = [fed.start_participant(p) for p in IDS]
            if coordinator.wait(3600) != 0:
                raise SystemExit(f"coordinator failed: {coordinator.last_error()}")
            for p in participants:
                p.wait(120)
        return Ledger(tmp / "run" / "ledger.jsonl").records()


def round_periods(records: list[RoundRecord]) -> list[float]:
    """Seconds between consecutive commits (``closed_at``): everything a round costs.

    One period covers the previous round's checkpoint and ledger line (written behind, beside
    this round's collection, and settled before its aggregation), the opening and its
    announcement, every FetchModel, the participants' decode, (no) training and seal, every
    SubmitUpdate, validation, the reduction, the outer step and the new model's hash. The
    first round is left out (it includes the participants joining).
    """
    stamps = [datetime.fromisoformat(r.closed_at) for r in records if r.state == "closed"]
    return [(b - a).total_seconds() for a, b in itertools.pairwise(stamps)]


def in_process_round(total: int, rounds: int) -> list[float]:
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        mapping = config_mapping(tmp, rounds)
        mapping["federation"]["transport"] = "in_process"
        config = validate_mapping(mapping)
        theta0 = make_params(total)
        arch = manifest(theta0)
        participants = {p: Participant(config, p, ScaleLearner(p), arch) for p in IDS}
        coordinator = Coordinator(config, theta0, output_dir=tmp / "run")
        del theta0
        summary = coordinator.run(InProcessTransport(participants))
        return [r.non_compute_s for r in summary.records]


# ------------------------------------------------------------------------ 2. throughput
def serve(config_path: Path, payload_bytes: int) -> None:
    """A coordinator transport with one open round whose judge accepts every update at once.

    Updates land in a spool under ``run.output_dir`` as a coordinator's do
    (``Coordinator.land``); the judge keeps none, so each file is free again for the next.
    """
    from lensemble.config import load_config
    from lensemble.federation.intake import Intake
    from lensemble.federation.spool import UpdateSpool
    from lensemble.network.coordinator.authenticator import Authenticator
    from lensemble.network.coordinator.download_server import start_model_download
    from lensemble.network.coordinator.server import start_coordinator_server
    from lensemble.network.coordinator.transport import GrpcCoordinatorTransport
    from lensemble.network.shared.security import server_credentials

    config = load_config(config_path)
    transport = GrpcCoordinatorTransport(config, next_round=0)
    spool = UpdateSpool(Path(config.run.output_dir) / "coordinator" / "spool")
    authenticator = Authenticator(config, config.participant_ids)
    # Both serve until the process is killed.
    start_model_download(transport, authenticator, config, port=config.network.download_port)
    _server, _ = start_coordinator_server(
        transport,
        authenticator,
        server_credentials(config),
        host="127.0.0.1",
        port=config.network.port,
        # Updates as large as the served payload (random bytes standing for float32 values).
        architecture={"payload": TensorSpec("payload", (payload_bytes // 4 + 1,), torch.float32)},
    )
    transport.attach(Intake(spool.land))
    payload = os.urandom(payload_bytes)
    opening = RoundOpening(0, 0, 0, bytes_hash(payload), time.monotonic() + 3600)
    transport.open_round(opening, payload)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        submission = transport.receive(time.monotonic() + 3600)
        if submission is not None:
            transport.reply(submission, Verdict(Reason.ACCEPTED, "ok", 0))
        del submission  # the payload goes now, not when the next one has arrived


def _tls_context(certs: Path | None, server: bool) -> ssl.SSLContext | None:
    """Python ``ssl`` with the run's own certificate kind (ECDSA P-256, mutual auth), or None."""
    if certs is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    identity = "coordinator" if server else IDS[0]
    context.load_cert_chain(certs / identity / "tls.crt", certs / identity / "tls.key")
    context.load_verify_locations(certs / "ca.crt")
    context.verify_mode = ssl.CERT_REQUIRED  # mutual TLS, as the gRPC transport runs it
    return context


def socket_peer(port: int, payload_bytes: int, certs: Path | None, hashed: bool = False) -> None:
    """Raw socket floor: send the payload to the first client, then read one back and ack.

    ``certs``: a ``lensemble certs init`` folder for a TLS socket (mutual auth), None for TCP.
    ``hashed``: SHA-256 each block read back as it arrives, before reading the next and before
    the ack, as the coordinator's SubmitUpdate does with every chunk (the update hash).
    """
    payload = os.urandom(payload_bytes)
    buffer = resident_buffer(payload_bytes)
    context = _tls_context(certs, server=True)
    with socket.create_server(("127.0.0.1", port)) as listener:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        raw, _ = listener.accept()
        conn = context.wrap_socket(raw, server_side=True) if context is not None else raw
        with conn:
            conn.sendall(payload)
            digest = hashlib.sha256() if hashed else None
            _receive(conn, buffer, digest)
            conn.sendall(b"k")


def resident_buffer(size: int) -> bytearray:
    """A ``size``-byte buffer with every page already faulted in (before any clock starts).

    The floors receive into it, so that they time the copy alone, not the kernel zeroing fresh
    pages: Lensemble's receivers write into a recycled, resident payload
    (:class:`lensemble.network.shared.streams.Assembler`), and a floor must be at least as fast.
    """
    buffer = bytearray(size)
    view = memoryview(buffer)
    view[:: mmap.PAGESIZE] = bytes(len(range(0, size, mmap.PAGESIZE)))  # one write per page
    return buffer


def _receive(conn: socket.socket, buffer: bytearray, digest: Any = None) -> None:
    view, got, size = memoryview(buffer), 0, len(buffer)
    while got < size:
        n = conn.recv_into(view[got:], min(4 * MiB, size - got))
        if n == 0:
            raise ConnectionError(f"peer closed after {got} of {size} bytes")
        if digest is not None:
            digest.update(view[got : got + n])
        got += n


def _spawn(*args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, str(HERE), *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


class GrpcPeer:
    """A coordinator process serving one open round, and a connected participant client.

    Spawned once and reused by every repetition, so that each repetition can time the gRPC
    streams right next to the raw socket floors (the channel is connected, and its TLS
    handshake done, by ``Join`` before anything is timed).
    """

    def __init__(self, tmp: Path, payload_bytes: int, chunk_bytes: int | None, tls: bool) -> None:
        from lensemble.network.participant.client import CoordinatorClient
        from lensemble.network.shared.proto import lensemble_pb2 as pb

        path, config = write_config(tmp, config_mapping(tmp, 1, chunk_bytes, tls))
        self.payload_bytes = payload_bytes
        self.chunk_bytes = config.network.chunk_bytes
        self._server = _spawn("_serve", str(path), str(payload_bytes))
        self._client = CoordinatorClient(config, "p0")
        self._client.join()
        # The same participant without the download port: FetchModel over gRPC.
        grpc_only = config.model_copy(
            update={"network": config.network.model_copy(update={"download_port": None})}
        )
        self._grpc_client = CoordinatorClient(grpc_only, "p0")
        self._grpc_client.join()
        announcement = self._client.watch((-1, 1 << 30))
        assert announcement is not None
        self._request = pb.RoundAnnouncement(
            round_index=0, model_hash=announcement.model_hash, model_bytes=payload_bytes
        )
        payload = os.urandom(payload_bytes)
        self._contribution = Contribution(payload, bytes_hash(payload), 0.0, 0.0)
        self._opening = RoundOpening(0, 0, 0, announcement.model_hash, time.monotonic() + 3600)

    def once(self) -> tuple[float, float, float]:
        """MB/s of one download over the download port, one over gRPC FetchModel, one upload.

        Each download is timed until the payload is in one buffer; the upload (SubmitUpdate)
        until the verdict.
        """
        mb = self.payload_bytes / 1e6
        fetched = []
        for client in (self._client, self._grpc_client):
            start = time.perf_counter()
            data = client.fetch(self._request)
            fetched.append(mb / (time.perf_counter() - start))
            assert len(data) == self.payload_bytes
            del data
        start = time.perf_counter()
        assert self._client.submit(self._opening, self._contribution).accepted
        submit_s = time.perf_counter() - start
        return fetched[0], fetched[1], mb / submit_s

    def close(self) -> None:
        """Close the clients and stop the coordinator process."""
        self._grpc_client.close()
        self._client.close()
        self._server.kill()
        self._server.wait()


def grpc_throughput(
    tmp: Path, payload_bytes: int, chunk_bytes: int | None, tls: bool, repeats: int = 3
) -> tuple[float, float]:
    """Median MB/s of FetchModel (over gRPC) and SubmitUpdate over ``repeats`` calls each."""
    peer = GrpcPeer(tmp, payload_bytes, chunk_bytes, tls)
    try:
        runs = [peer.once() for _ in range(repeats)]
    finally:
        peer.close()
    _download, fetch, submit = (statistics.median(x) for x in zip(*runs, strict=True))
    return fetch, submit


def socket_throughput(
    payload_bytes: int, certs: Path | None = None, hashed: bool = False
) -> tuple[float, float]:
    """MB/s down and up of a raw socket copy between two processes (TLS when ``certs``).

    Down: from the client's first read until the whole payload is in one buffer (the peer
    starts sending at once). Up: from the first byte sent until the peer acknowledged the whole
    payload (``hashed``: the peer SHA-256es every block as it arrives, see
    :func:`socket_peer`). The TLS handshake happens before either clock starts, as it does for
    gRPC (the channel is connected by Join before FetchModel and SubmitUpdate are timed).
    Every receiving buffer is resident before the clock starts (:func:`resident_buffer`).
    """
    port = free_port()
    extra = ["hash"] if hashed else []
    peer = _spawn("_sock", str(port), str(payload_bytes), str(certs or "-"), *extra)
    context = _tls_context(certs, server=False)
    buffer = resident_buffer(payload_bytes)  # before connecting: the peer sends at once
    try:
        raw = socket.create_connection(("127.0.0.1", port))
        conn = context.wrap_socket(raw, server_hostname="127.0.0.1") if context is not None else raw
        with conn:
            start = time.perf_counter()
            _receive(conn, buffer)
            down = time.perf_counter() - start
            start = time.perf_counter()
            conn.sendall(buffer)
            assert conn.recv(1) == b"k"
            up = time.perf_counter() - start
    finally:
        peer.wait(30)
    mb = payload_bytes / 1e6
    return mb / down, mb / up


_FLOOR_FETCH = "/floor.Floor/Fetch"
_FLOOR_SUBMIT = "/floor.Floor/Submit"


def grpc_floor_peer(port: int, payload_bytes: int, chunk_bytes: int, certs: Path) -> None:
    """The gRPC floor's server: the fewest steps grpcio needs to stream the same bytes.

    Generic handlers with identity serializers (bytes in, bytes out, no protobuf), the payload
    cut into ``chunk_bytes`` pieces before the clock starts, mutual TLS with the run's own
    certificates, grpcio's default options bar the message size: what Lensemble's FetchModel
    and SubmitUpdate cost beyond it is ours.
    """
    from concurrent import futures

    import grpc

    payload = os.urandom(payload_bytes)
    pieces = [payload[i : i + chunk_bytes] for i in range(0, payload_bytes, chunk_bytes)]

    def fetch(_request: bytes, _context: Any) -> Any:
        yield from pieces

    def submit(chunks: Any, _context: Any) -> bytes:
        return str(sum(len(chunk) for chunk in chunks)).encode()

    handler = grpc.method_handlers_generic_handler(
        "floor.Floor",
        {
            "Fetch": grpc.unary_stream_rpc_method_handler(fetch),
            "Submit": grpc.stream_unary_rpc_method_handler(submit),
        },
    )
    limit = chunk_bytes + (64 << 10)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
        ],
    )
    server.add_generic_rpc_handlers((handler,))
    identity = certs / "coordinator"
    credentials = grpc.ssl_server_credentials(
        [((identity / "tls.key").read_bytes(), (identity / "tls.crt").read_bytes())],
        root_certificates=(certs / "ca.crt").read_bytes(),
        require_client_auth=True,
    )
    server.add_secure_port(f"127.0.0.1:{port}", credentials)
    server.start()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    server.wait_for_termination()


class GrpcFloor:
    """A connected client of :func:`grpc_floor_peer` (spawned once, reused per repetition)."""

    def __init__(self, payload_bytes: int, chunk_bytes: int, certs: Path) -> None:
        import grpc

        port = free_port()
        self.payload_bytes, self.chunk_bytes = payload_bytes, chunk_bytes
        self._server = _spawn("_floor", str(port), str(payload_bytes), str(chunk_bytes), str(certs))
        identity = certs / IDS[0]
        credentials = grpc.ssl_channel_credentials(
            root_certificates=(certs / "ca.crt").read_bytes(),
            private_key=(identity / "tls.key").read_bytes(),
            certificate_chain=(identity / "tls.crt").read_bytes(),
        )
        limit = chunk_bytes + (64 << 10)
        self._channel = grpc.secure_channel(
            f"localhost:{port}",
            credentials,
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
            ],
        )
        self._fetch = self._channel.unary_stream(_FLOOR_FETCH)
        self._submit = self._channel.stream_unary(_FLOOR_SUBMIT)
        self._upload = os.urandom(payload_bytes)
        self.once()  # connects (and shakes hands) outside any clock

    def once(self) -> tuple[float, float]:
        """MB/s of one download into one buffer and one upload until the server's answer."""
        buffer, got = resident_buffer(self.payload_bytes), 0
        start = time.perf_counter()
        for piece in self._fetch(b""):
            buffer[got : got + len(piece)] = piece
            got += len(piece)
        fetch_s = time.perf_counter() - start
        assert got == self.payload_bytes
        view = memoryview(self._upload)
        start = time.perf_counter()
        answer = self._submit(
            bytes(view[i : i + self.chunk_bytes])
            for i in range(0, self.payload_bytes, self.chunk_bytes)
        )
        submit_s = time.perf_counter() - start
        assert int(answer) == self.payload_bytes
        mb = self.payload_bytes / 1e6
        return mb / fetch_s, mb / submit_s

    def close(self) -> None:
        """Close the channel and stop the server process."""
        self._channel.close()
        self._server.kill()
        self._server.wait()


# ------------------------------------------------------------------------------ main
def _proc(argv: list[str]) -> None:
    """A coordinator or participant process with the no-compute learner (LocalFederation)."""
    from lensemble.config import load_config
    from lensemble.network.launch.harness import PortOptions
    from lensemble.network.launch.process import run_coordinator, run_participant

    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=int, required=True)
    parser.add_argument("role")
    parser.add_argument("--config")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--id")
    parser.add_argument("--health-port", type=int)
    parser.add_argument("--metrics-port", type=int)
    args = parser.parse_args(argv)
    config = load_config(args.config, args.set)
    ports = PortOptions(None, args.health_port, args.metrics_port)
    if args.role == "coordinator":
        # A builder, as the lensemble command passes: the coordinator keeps only its own copy.
        run_coordinator(config, lambda: make_params(args.params), ports)
        rss_file = os.environ.get(RSS_FILE_ENV)
        if rss_file:  # peak RSS of this coordinator process, for bench/peer_flower.py
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            Path(rss_file).write_text(json.dumps({"peak_rss_mb": peak}))
    else:
        # Four no-compute participants share this machine with the coordinator: one torch
        # thread each, like numpy in the peer's clients (bench/peer_flower.py).
        torch.set_num_threads(1)
        theta0 = make_params(args.params)
        run_participant(config, args.id, lambda: ScaleLearner(args.id), theta0, ports)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", default="10M,100M", help="model sizes, e.g. 10M,100M")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-rounds", action="store_true")
    parser.add_argument("--skip-chunks", action="store_true")
    parser.add_argument("--latency", default="", help="table 0 at this size, e.g. 1M")
    parser.add_argument("--latency-rounds", type=int, default=11)
    parser.add_argument("--repeats", type=int, default=5, help="table 2 repetitions")
    parser.add_argument(
        "--chunk", type=int, default=None, help="network.chunk_bytes for table 2 (default: config)"
    )
    args = parser.parse_args()
    sizes = [parse_count(s) for s in args.params.split(",")]

    if args.latency:
        print(
            f"0. Round period at {args.latency} params, N = 4, no compute, loopback: seconds "
            f"between consecutive commits (median over {args.latency_rounds - 1} rounds)"
        )
        print(f"{'transport':>10} {'median':>7} {'min':>6} {'max':>6}")
        latency_params = parse_count(args.latency)
        for tls in (True, False):
            periods = round_periods(network_round(latency_params, args.latency_rounds, tls=tls))
            print(
                f"{'mTLS' if tls else 'plain':>10} {statistics.median(periods):>7.3f} "
                f"{min(periods):>6.3f} {max(periods):>6.3f}"
            )
        print()

    if not args.skip_rounds:
        print("1. Round non-compute overhead, N = 4 (median over rounds, seconds)")
        print(f"{'params':>8} {'MB/model':>9} {'in-process':>11} {'network mTLS':>13} {'ratio':>6}")
        for total in sizes:
            local = statistics.median(in_process_round(total, args.rounds))
            remote = statistics.median(r.non_compute_s for r in network_round(total, args.rounds))
            print(
                f"{total / 1e6:>7.0f}M {total * 4 / 1e6:>9.0f} {local:>11.2f} {remote:>13.2f} "
                f"{remote / local:>6.2f}"
            )
        print()

    print(
        f"2. Throughput on loopback (MB/s of payload; {args.repeats} interleaved repetitions of "
        "raw TCP, raw TLS, raw TLS whose receiver SHA-256es every block (TLS+h), the gRPC "
        "floor (mTLS), the download port (Down), FetchModel and SubmitUpdate over mTLS and in "
        "plaintext (pl): medians; for the "
        "ratios to raw TLS, TLS+h and the gRPC floor, the median of each repetition's ratio "
        "and their range)"
    )
    print(
        f"{'MB':>4} {'TCP dn':>6} {'TCP up':>6} {'TLS dn':>6} {'TLS up':>6} {'TLS+h':>6} "
        f"{'gRPC dn':>7} {'gRPC up':>7} {'Down':>6} {'Fetch':>6} {'Submit':>6} {'D pl':>5} "
        f"{'F pl':>5} {'S pl':>5} | "
        f"{'Down/TLS':>16} {'Fetch/TLS':>16} {'Submit/TLS':>16} {'Submit/TLS+h':>16} | "
        f"{'Fetch/gRPC':>16} {'Submit/gRPC':>16}"
    )
    for total in sizes:
        payload = total * 4
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            secure = GrpcPeer(Path(a), payload, args.chunk, tls=True)
            plain = GrpcPeer(Path(b), payload, args.chunk, tls=False)
            chunk = secure.chunk_bytes
            floor = GrpcFloor(payload, chunk, Path(a) / "certs")
            rows = []
            try:
                for _ in range(args.repeats):
                    rows.append(
                        (
                            *socket_throughput(payload),
                            *socket_throughput(payload, Path(a) / "certs"),
                            socket_throughput(payload, Path(a) / "certs", hashed=True)[1],
                            *floor.once(),
                            *secure.once(),
                            *plain.once(),
                        )
                    )
            finally:
                floor.close()
                secure.close()
                plain.close()
        med = [statistics.median(column) for column in zip(*rows, strict=True)]
        widths = (6, 6, 6, 6, 6, 7, 7, 6, 6, 6, 5, 5, 5)  # the header's columns

        def spread(ratios: list[float]) -> str:
            return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"

        print(
            f"{payload / 1e6:>4.0f} "
            + " ".join(f"{m:>{w}.0f}" for m, w in zip(med, widths, strict=True))
            + f" | {spread([r[7] / r[2] for r in rows]):>16} "
            f"{spread([r[8] / r[2] for r in rows]):>16} "
            f"{spread([r[9] / r[3] for r in rows]):>16} "
            f"{spread([r[9] / r[4] for r in rows]):>16} | "
            f"{spread([r[8] / r[5] for r in rows]):>16} {spread([r[9] / r[6] for r in rows]):>16}"
        )
    print()

    if args.skip_chunks:
        return
    payload = sizes[0] * 4
    print(f"3. Chunk size (network.chunk_bytes), {payload / 1e6:.0f} MB payload, mTLS (MB/s)")
    print(f"{'chunk':>8} {'Fetch':>7} {'Submit':>7}")
    for chunk in (64 * 1024, 256 * 1024, MiB, 4 * MiB, 16 * MiB):
        with tempfile.TemporaryDirectory() as a:
            fetch, submit = grpc_throughput(Path(a), payload, chunk, tls=True)
        print(f"{chunk // 1024:>6}Ki {fetch:>7.0f} {submit:>7.0f}")


if __name__ == "__main__":
    from lensemble.machinery.allocator import keep_freed_buffers

    keep_freed_buffers()  # in every process of this bench, as the CLI does for every command
    if len(sys.argv) > 1 and sys.argv[1] == "_proc":
        _proc(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "_serve":
        serve(Path(sys.argv[2]), int(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "_floor":
        grpc_floor_peer(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]))
    elif len(sys.argv) > 1 and sys.argv[1] == "_sock":
        certs = Path(sys.argv[4]) if sys.argv[4] != "-" else None
        socket_peer(int(sys.argv[2]), int(sys.argv[3]), certs, hashed=sys.argv[5:] == ["hash"])
    else:
        main()
