"""Coordinator peak memory against the number of participants, over mTLS on loopback (issue 19).

One real coordinator process (``bench/network_transport.py``'s, the ``lensemble`` network
coordinator with float32 parameters in 8 tensors) runs ``--rounds`` rounds with N participant
processes, every one in every round (quorum N), for each N of ``--participants``. Reported: the
coordinator's peak RSS (``ru_maxrss``), and that peak against the memory the coordinator cannot
do without: the global model plus the outer optimizer's momentum (``2 x 4 bytes x params``).

The participants are **replay participants**: each speaks the real protocol through
``CoordinatorClient`` (Join, Presence, WatchRounds, FetchModel, SubmitUpdate, Leave, with its
own certificate) but trains nothing and keeps nothing. It reads the model's chunks and drops
them, then streams an update whose tensors are one shared file of small float32 values (a
read-only ``mmap`` in every participant, so the page cache holds one copy for all of them),
behind a safetensors header sealed for that round, participant and base model exactly as
``Participant.contribute`` seals it, and with the SHA-256 the coordinator checks. A real
participant holds its data, the model and its optimizer state; sixteen of those at 100M
parameters need about 26 GB, more than this machine has, and the coordinator cannot tell the
difference: what it receives, checks, lands, reduces and commits is the same.

Run from the repository root (at 100M, about 5 minutes per repetition of N = 4 and 16)::

    python bench/coordinator_rss.py --params 10M,100M --participants 4,16 --repeats 2

Repetitions interleave the values of N. The same script runs against another checkout's code
with ``PYTHONPATH=<checkout>/runtime``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import statistics
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

import grpc
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import network_transport as nt

from lensemble.config import load_config
from lensemble.federation.ledger import Ledger
from lensemble.federation.payload import encode_parts
from lensemble.network.launch.launcher import LocalFederation
from lensemble.network.participant.client import CoordinatorClient
from lensemble.network.shared.frames import UPDATE_DATA_FIELD
from lensemble.network.shared.proto import lensemble_pb2 as pb
from lensemble.network.shared.streams import chunks, with_bytes_field

HERE = Path(__file__).resolve()
#: The replay update's value: small, finite and the same everywhere (no defense refuses it).
UPDATE_VALUE = 1e-4


def write_update(path: Path, total: int) -> None:
    """The shared tensor bytes of every replay update: ``total`` float32 values, raw."""
    size = total // nt.TENSORS
    block = torch.full((size,), UPDATE_VALUE, dtype=torch.float32).numpy().tobytes()
    with path.open("wb") as out:
        for _ in range(nt.TENSORS):
            out.write(block)


def update_tensors(path: Path, total: int) -> tuple[mmap.mmap, dict[str, torch.Tensor]]:
    """Views of the shared update file, named as ``network_transport.make_params`` names them."""
    size = total // nt.TENSORS
    with path.open("rb") as handle:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(mapped)
    tensors = {}
    for i in range(nt.TENSORS):
        part = view[i * size * 4 : (i + 1) * size * 4]
        # Read-only memory: torch warns that it cannot be written; nothing here writes it.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            tensors[f"layer.{i}.weight"] = torch.frombuffer(part, dtype=torch.float32)
    return mapped, tensors


def replay(config_path: Path, participant_id: str, update_path: Path, total: int) -> None:
    """One replay participant: takes part in every round until the coordinator says final."""
    config = load_config(config_path)
    fed = config.federation
    _mapped, tensors = update_tensors(update_path, total)
    client = CoordinatorClient(config, participant_id)
    while True:
        try:
            if client.join().accepted:
                break
        except grpc.RpcError:
            threading.Event().wait(0.2)  # the coordinator is still starting
    done = threading.Event()
    presence = threading.Thread(target=client.hold_presence, args=(done,), daemon=True)
    presence.start()
    after = (-1, 1 << 30)
    while True:
        announcement = client.watch(after)
        if announcement is None:
            continue
        if announcement.final:
            break
        after = (announcement.round_index, announcement.attempt)
        call = client._fetch_model(  # read and drop: a replay participant keeps no model
            pb.FetchModelRequest(
                participant_id=participant_id,
                session=client.session,
                model_hash=announcement.model_hash,
            ),
            timeout=600,
            metadata=client.metadata,
        )
        for _frame in call:
            pass
        metadata = {
            "kind": "pseudo-gradient",
            "round": str(announcement.round_index),
            "attempt": str(announcement.attempt),
            "participant": participant_id,
            "base_hash": announcement.model_hash,
            "quantization": fed.quantization,
            "int8_chunk": str(fed.int8_chunk),
            "mean_loss": repr(0.0),
            "compute_s": f"{0.0:.6f}",
        }
        parts = encode_parts(tensors, metadata)
        digest = hashlib.sha256()
        for part in parts:
            digest.update(part)
        header = pb.UpdateHeader(
            participant_id=participant_id,
            session=client.session,
            round_index=announcement.round_index,
            attempt=announcement.attempt,
            payload_hash="sha256:" + digest.hexdigest(),
            quantization=fed.quantization,
            total_bytes=sum(len(part) for part in parts),
        )

        def frames(parts: list[Any] = parts, header: pb.UpdateHeader = header) -> Any:
            prefix = pb.UpdateChunk(header=header).SerializeToString()
            for part in parts:
                for view in chunks(part, client.chunk_bytes):
                    yield with_bytes_field(prefix, UPDATE_DATA_FIELD, view)
                    prefix = b""

        reply = client._submit_update(frames(), timeout=600, metadata=client.metadata)
        if not reply.accepted:
            raise SystemExit(f"{participant_id}: update refused: {reply.reason}: {reply.message}")
    done.set()
    client.leave("run over")
    client.close()


def run(total: int, n: int, rounds: int, update_path: Path) -> tuple[float, list[float]]:
    """One run: the coordinator's peak RSS (MB) and its round periods (seconds)."""
    os.sync()
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        mapping = nt.config_mapping(tmp, rounds)
        mapping["federation"]["participants"] = [{"id": f"p{i:02d}"} for i in range(n)]
        mapping["federation"]["quorum"] = n
        path, _ = nt.write_config(tmp, mapping)
        rss = tmp / "rss.json"
        os.environ[nt.RSS_FILE_ENV] = str(rss)
        program = [sys.executable, str(HERE), "_proc", str(total), str(update_path)]
        with LocalFederation(path, [], tmp / "logs", program=program) as fed:
            coordinator = fed.start_coordinator()
            participants = [fed.start_participant(f"p{i:02d}") for i in range(n)]
            if coordinator.wait(3600) != 0:
                raise SystemExit(f"coordinator failed: {coordinator.last_error()}")
            for p in participants:
                if p.wait(120) != 0:
                    raise SystemExit(f"participant failed: {p.last_error()}")
        peak = float(json.loads(rss.read_text())["peak_rss_mb"])
        periods = nt.round_periods(Ledger(tmp / "run" / "ledger.jsonl").records())
        return peak, periods


def _proc(argv: list[str]) -> None:
    """A LocalFederation child: the bench's coordinator, or a replay participant."""
    total, update_path, role, *rest = argv
    if role == "coordinator":
        nt._proc(["--params", total, role, *rest])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--id", required=True)
    parser.add_argument("--health-port", type=int)
    parser.add_argument("--metrics-port", type=int)
    args = parser.parse_args(rest)
    replay(Path(args.config), args.id, Path(update_path), int(total))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", default="10M,100M", help="model sizes, e.g. 10M,100M")
    parser.add_argument("--participants", default="4,16", help="values of N, e.g. 4,16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    sizes = [nt.parse_count(s) for s in args.params.split(",")]
    counts = [int(s) for s in args.participants.split(",")]
    print(
        f"Coordinator peak RSS (MB), mTLS loopback, {args.rounds} rounds, replay participants, "
        f"{args.repeats} interleaved repetitions; floor = global model + outer momentum"
    )
    print(
        f"{'params':>7} {'N':>3} {'floor':>6} {'peak (runs)':>24} {'median':>7} "
        f"{'/floor':>7} {'/N=' + str(counts[0]):>7} {'round s':>8}"
    )
    for total in sizes:
        floor = 2 * 4 * total / 1e6
        peaks: dict[int, list[float]] = {n: [] for n in counts}
        periods: dict[int, list[float]] = {n: [] for n in counts}
        with tempfile.TemporaryDirectory() as folder:
            update_path = Path(folder) / "update.f32"
            write_update(update_path, total)
            for _ in range(args.repeats):
                for n in counts:
                    peak, run_periods = run(total, n, args.rounds, update_path)
                    peaks[n].append(peak)
                    periods[n].extend(run_periods)
        base = statistics.median(peaks[counts[0]])
        for n in counts:
            median = statistics.median(peaks[n])
            runs = ", ".join(f"{p:.0f}" for p in peaks[n])
            print(
                f"{total / 1e6:>6.0f}M {n:>3} {floor:>6.0f} {runs:>24} {median:>7.0f} "
                f"{median / floor:>7.2f} {median / base:>7.2f} "
                f"{statistics.median(periods[n]):>8.2f}",
                flush=True,
            )


if __name__ == "__main__":
    from lensemble.machinery.allocator import keep_freed_buffers

    keep_freed_buffers()  # in every process of this bench, as the CLI does for every command
    if len(sys.argv) > 1 and sys.argv[1] == "_proc":
        _proc(sys.argv[2:])
    else:
        main()
