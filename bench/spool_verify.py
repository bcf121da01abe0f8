"""What verifying spooled updates on use costs the coordinator, at 10M parameters.

Two steps touch every byte of an update that landed in (or was spilled to) an unnamed spool
file, and both now check that the bytes they use are the bytes received:

- ``judge``: ``Admission.accept`` of one landed update (float32, no quantization): the
  coordinator copies it out of its spool file with ``pread`` and hashes the copy before it
  judges it (before: it judged a mapping of the file, trusting the hash taken on receipt);
- ``reduce``: ``aggregate_spooled`` (the plain mean) over N unnamed spool files: each file is read
  into the reader's buffers and hashed on the hashing thread beside the reduction (before: the
  reduction read a mapping of the file, no copy, no hash).

Reported: the median of ``--repeat`` runs, in milliseconds of wall time (``--clock cpu``: the
process's CPU time, all threads, which counts the hashing thread's work where wall time shows
how much of it overlaps), plus the floors taken in the same process (one SHA-256 and one copy
of a payload). Torch runs one intra-op thread, as in the coordinator process. Run it against
the code before and after a change with ``PYTHONPATH``, interleaved, on an idle machine:

    nice -n 19 python bench/spool_verify.py                     # 10M, N = 4, in /dev/shm
    nice -n 19 python bench/spool_verify.py --params 1000000 --n 16 --folder /var/tmp/x
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from lensemble.config.load import validate_mapping
from lensemble.config.schema import RobustnessConfig
from lensemble.federation.admission import Admission
from lensemble.federation.messages import RoundOpening, Submission
from lensemble.federation.payload import bytes_hash, encode, manifest
from lensemble.federation.robustness import aggregate_spooled, decide
from lensemble.federation.spool import UpdateSpool

TENSOR = 1 << 20
BASE = "sha256:" + "0" * 64


def make_update(total: int, seed: int) -> dict[str, torch.Tensor]:
    """A pseudo-gradient of ``total`` float32 parameters in 1M-element tensors."""
    g = torch.Generator().manual_seed(seed)
    out, left, i = {}, total, 0
    while left > 0:
        n = min(TENSOR, left)
        out[f"layer.{i:04d}.weight"] = torch.randn(n, generator=g)
        left, i = left - n, i + 1
    return out


def payload_of(update: dict[str, torch.Tensor], pid: str) -> bytes:
    meta = {
        "kind": "pseudo-gradient",
        "round": "0",
        "attempt": "0",
        "participant": pid,
        "quantization": "none",
        "int8_chunk": "0",
        "base_hash": BASE,
    }
    return encode(update, meta)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def median_ms(run: Callable[[], object], repeat: int, clock: str) -> float:
    """Median milliseconds of ``repeat`` runs on ``clock`` (``cpu``: every thread's CPU time)."""
    now = CLOCKS[clock]
    times = []
    for _ in range(repeat):
        start = now()
        run()
        times.append(now() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=10_000_000)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--folder", type=Path, default=Path("/dev/shm/lensemble-spool-bench"))
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the coordinator process runs (COORDINATOR_TORCH_THREADS)
    ids = [f"p{i:02d}" for i in range(args.n)]
    updates = {pid: make_update(args.params, i) for i, pid in enumerate(ids)}
    payloads = {pid: payload_of(u, pid) for pid, u in updates.items()}
    fed = validate_mapping({"federation": {"participants": [{"id": pid} for pid in ids]}})
    arch = manifest(updates[ids[0]])
    shutil.rmtree(args.folder, ignore_errors=True)
    spool = UpdateSpool(args.folder)
    admission = Admission(fed.federation, arch, spool, lambda: 0)

    def judge_all() -> None:
        admission.open(RoundOpening(0, 0, 0, BASE, 1e9))
        for pid in ids:
            data = payloads[pid]
            landing = spool.land(len(data))
            assert landing is not None, "the folder cannot make unnamed files"
            landing.write(data)
            view = landing.finish()
            sub = Submission(pid, 0, view, bytes_hash(data), 0, hash_checked=True, landed=landing)
            del view, landing
            verdict = admission.accept(sub)
            assert verdict.accepted, verdict.message

    def land_all() -> None:  # the landing alone, to subtract it from judge_all
        for pid in ids:
            data = payloads[pid]
            landing = spool.land(len(data))
            assert landing is not None
            landing.write(data)
            del landing

    judged = median_ms(judge_all, args.repeat, args.clock)
    judge = (judged - median_ms(land_all, args.repeat, args.clock)) / args.n
    judge_all()
    config = RobustnessConfig()
    col = admission.collection
    assert col is not None
    screening = decide(col.norms, config)
    shapes = {name: tuple(t.shape) for name, t in updates[ids[0]].items()}

    def reduce() -> None:
        aggregate_spooled(spool, screening, shapes, config, scheme="none", chunk=0)

    reduced = median_ms(reduce, args.repeat, args.clock)
    one = payloads[ids[0]]
    hashed = median_ms(lambda: hashlib.sha256(one).digest(), args.repeat, args.clock)
    source = np.frombuffer(one, dtype=np.uint8)
    target = np.empty_like(source)
    copied = median_ms(lambda: np.copyto(target, source), args.repeat, args.clock)
    spool.close()
    shutil.rmtree(args.folder, ignore_errors=True)
    mb = len(one) / 1e6
    print(
        f"params {args.params:,}, N = {args.n}, payload {mb:.1f} MB, folder {args.folder}, "
        f"{args.clock} clock"
    )
    print(f"judge one landed update  {judge:8.1f} ms")
    print(f"reduce N spooled updates {reduced:8.1f} ms")
    print(f"floors: sha256 of one payload {hashed:.1f} ms, copy of one payload {copied:.1f} ms")


if __name__ == "__main__":
    main()
