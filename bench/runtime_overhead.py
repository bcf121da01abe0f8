"""The coordinator's hot path against the machine's floors, and its peak memory, in one run.

Everything is measured in the same run, each figure next to its floor for the same bytes, and
every duration on the same clock: by default this process's CPU time (all threads), so that a
shared machine's load does not decide the ratios (``--clock wall`` for wall time; it then also
counts waiting for the disk). Floors are measured before and after the figures; the faster
pass is used, which can only make a ratio look worse:

- **copy floor**: a copy of the model's float32 bytes into buffers already touched once (reads
  and writes every byte once: memory bandwidth as Python sees it, without page faults);
- **hash floor**: ``hashlib.sha256`` over the same bytes (SHA-256 has its own ceiling, below
  memory bandwidth; the hashing figure is given against both floors).

Each floor is the faster of two passes: tensor by tensor in the tensors' own memory (once for
separately allocated tensors, once for the flat model), and over one contiguous numpy copy
(which numpy backs with huge pages). The run uses the container image's huge-page environment
(:mod:`lensemble.machinery.hugepages`) unless ``--memory-env as-is``, and keeps freed buffers in
``malloc`` as the ``lensemble`` command does (:mod:`lensemble.machinery.allocator`).

Per model size (float32 parameters, 1M-element tensors), in this process:

The model is held as the coordinator holds it, float32 views into one buffer
(:mod:`lensemble.machinery.flat`).

- ``encode``: :func:`~lensemble.federation.payload.encode` of the model (the one copy that
  builds the payload; as every round does, it writes over the previous payload once that is
  released, see :mod:`lensemble.machinery.fresh_bytes`); ``parse``:
  :func:`~lensemble.federation.payload.decode` with ``copy=False``, as the coordinator judges
  an update (header checks, tensors are views);
  ``serialize`` = both together, MB of parameters / (encode s + parse s). ``fresh`` is a
  reference, not a floor: the same bytes copied into a newly allocated array, which any new
  payload must pay for (the kernel's first touch of every page).
- ``hash``: :func:`~lensemble.federation.payload.tensor_digest` of the model (the model hash).
- ``reduce``: :func:`~lensemble.federation.diloco.canonical_mean` over 4 in-memory updates
  (MB of updates summed / s): the reduction itself, in place.

Per model size and number of participants N, in a fresh child process (so that its peak RSS is
the coordinator's own: no participant runs in it), a :class:`~lensemble.federation.coordinator.
Coordinator` with its state folder on disk runs rounds against a synthetic transport that
builds each update only when the coordinator asks for the next submission (one update alive
at a time; building it is reported as compute and left out of the overhead):

- ``spool agg``: the coordinator's aggregation as it runs at round close, i.e.
  :func:`~lensemble.federation.robustness.aggregate_spooled` (mean) over N spilled updates:
  read back from the spool (re-hashed only where the spool's file system cannot make unnamed
  files), accumulated; MB of updates / s, against the copy floor and against the copy + hash
  floor of those bytes.
- ``round``: one committed round's non-compute time as the ledger's ``non_compute_s`` reports
  it (open, judge every update: hash, parse, dequantize, norm, spill; close: screen, read back
  and reduce, outer step, pre-commit check, model hash) **plus** the checkpoint write and the
  ledger append that follow it (timed around ``run_round``; the ledger's figure leaves them
  out because it is taken before they happen). Its floor is what a round cannot avoid
  touching: every update hashed once and read once (N x model bytes, hash + copy), the model
  payload built and hashed (1 x, copy + hash) and the checkpoint's parameters and momentum
  copied and hashed (2 x, copy + hash): ``(N + 3) x model bytes x (1/copy + 1/hash)``.
- ``peak RSS``: the child's ``VmHWM`` (peak resident set), with what it should be made of: the
  global model, the outer momentum, the cached model payload, the new model and momentum of the
  outer step, the reduction's accumulator, and the transport's update being built (its base
  and payload).

    nice -n 19 python bench/runtime_overhead.py                    # 10M, N = 4 and 16
    nice -n 19 python bench/runtime_overhead.py --sizes 10,100     # adds 100M (~9 GB of disk)
    # short of disk: the spool (N x 400 MB at 100M) on tmpfs, checkpoints still on disk
    nice -n 19 python bench/runtime_overhead.py --sizes 10,100 --spool-scratch /dev/shm
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch

from lensemble.machinery.allocator import keep_freed_buffers
from lensemble.machinery.hugepages import HUGEPAGE_ENV

MB = 1e6
#: What every duration is measured on: this process's CPU time (all its threads), so that the
#: figures and their floors compare work, not how much of a shared machine the run got; or
#: wall time (``--clock wall``) on a quiet machine.
CLOCK: Callable[[], float] = time.process_time
TENSOR = 1 << 20  # parameters per tensor: a model is a stack of 1M-element tensors
#: Model-sized buffers the synthetic transport itself holds (the base update, one payload).
TRANSPORT_MODELS = 2


def make_params(total: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out, left, i = {}, total, 0
    while left > 0:
        n = min(TENSOR, left)
        out[f"layer.{i:04d}.weight"] = torch.randn(n, generator=g)
        left, i = left - n, i + 1
    return out


def best_of(fn: Callable[[], object], repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        start = CLOCK()
        fn()
        times.append(CLOCK() - start)
    return min(times)


def floors(params: Mapping[str, torch.Tensor]) -> tuple[float, float]:
    """(copy floor, hash floor) in MB/s over the float32 bytes of ``params``.

    Each floor is the faster of two passes over the same bytes: tensor by tensor in the
    tensors' own memory (a ``copy_`` into preallocated tensors; ``hashlib.sha256`` updated
    with each tensor's bytes), and over one contiguous numpy copy of them (which numpy backs
    with transparent huge pages). The faster floor can only make a ratio look worse.
    """
    tensors = list(params.values())
    dests = [torch.empty_like(t) for t in tensors]
    flat = np.concatenate([t.numpy() for t in tensors])
    dest = np.empty_like(flat)
    np.copyto(dest, flat)  # touched once: a copy floor is a copy, not page faults
    for d, t in zip(dests, tensors, strict=True):
        d.copy_(t)
    mb = flat.nbytes / MB

    def own_copy() -> None:
        for d, t in zip(dests, tensors, strict=True):
            d.copy_(t)

    def own_hash() -> None:
        h = hashlib.sha256()
        for t in tensors:
            h.update(t.numpy().data)

    copy = mb / min(best_of(own_copy), best_of(lambda: np.copyto(dest, flat)))
    digest = mb / min(best_of(own_hash), best_of(lambda: hashlib.sha256(flat.data).digest()))
    return copy, digest


def fresh_copy(params: Mapping[str, torch.Tensor]) -> float:
    """MB/s of copying the model's bytes into a newly allocated buffer.

    What building any new payload must do: memory bandwidth plus the kernel's first touch of
    every page (numpy advises huge pages for it, as :mod:`lensemble.machinery.fresh_bytes`
    does). Not a floor: a reference for what a fresh buffer costs on this machine.
    """
    flat = np.concatenate([t.numpy() for t in params.values()])

    def once() -> None:
        np.copyto(np.empty_like(flat), flat)

    return flat.nbytes / MB / best_of(once)


def reset_peak_rss() -> None:
    """Start this process's peak resident set over from its current one (Linux 4.0+)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_bytes() -> int:
    """This process's peak resident set (``VmHWM``).

    Not ``ru_maxrss``: that survives ``exec`` and would report the parent's peak when the
    parent was larger.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmHWM line (Linux only)")


# ----------------------------------------------------------------------- the child: one coordinator
class SyntheticTransport:
    """Delivers N updates of the same values, each built only when the coordinator asks.

    Its own memory is the base update and the one payload in flight: :data:`TRANSPORT_MODELS`
    models, whatever N is (the coordinator's peak below is reported with and without it).
    """

    def __init__(self, config, base: Mapping[str, torch.Tensor]) -> None:  # type: ignore[no-untyped-def]
        self.ids = sorted(p.id for p in config.federation.participants)
        self.config = config
        self.base = base
        self.compute = self.compute_clock = 0.0
        self.up = self.down = 0
        self.pending: list[str] = []

    def now(self) -> float:
        return time.monotonic()

    def wait_for_participants(self, quorum: int, timeout_s: float) -> set[str]:
        return set(self.ids)

    def open_round(self, opening, model_payload: bytes) -> None:  # type: ignore[no-untyped-def]
        self.opening = opening
        self.down += len(model_payload) * len(self.ids)
        self.pending = list(reversed(self.ids))  # arrival order: reverse of canonical

    def receive(self, until_s: float):  # type: ignore[no-untyped-def]
        from lensemble.federation.messages import Submission
        from lensemble.federation.payload import bytes_hash, encode

        if not self.pending:
            return None
        start, cpu = time.perf_counter(), CLOCK()
        pid = self.pending.pop()
        fed = self.config.federation
        # Every update carries the base values under its own header: one payload alive at a
        # time besides the base, as a network transport holds one upload (2 models in all).
        # Built as a remote participant builds it, in its own memory: never recycled here.
        payload = encode(
            self.base,
            {
                "kind": "pseudo-gradient",
                "round": str(self.opening.round_index),
                "attempt": str(self.opening.attempt),
                "participant": pid,
                "quantization": fed.quantization,
                "int8_chunk": str(fed.int8_chunk),
                "base_hash": self.opening.model_hash,
            },
            recycle=False,
        )
        digest = bytes_hash(payload)  # the participant's declared hash: its side, not ours
        self.compute += time.perf_counter() - start
        self.compute_clock += CLOCK() - cpu
        self.up += len(payload)
        return Submission(pid, self.opening.round_index, payload, digest, self.opening.attempt)

    def reply(self, submission, verdict) -> None:  # type: ignore[no-untyped-def]
        assert verdict.accepted, verdict

    def round_closed(self, record) -> None:  # type: ignore[no-untyped-def]
        pass

    def take_traffic(self):  # type: ignore[no-untyped-def]
        from lensemble.federation.transport import Traffic

        traffic = Traffic(self.down, self.up, self.compute)
        self.compute, self.up, self.down = 0.0, 0, 0
        return traffic

    def finish(self) -> None:
        pass


def child(total: int, n: int, rounds: int, folder: Path, spool: Path) -> dict[str, float]:
    """One coordinator, ``rounds`` rounds of ``n`` updates of ``total`` parameters.

    Checkpoints and ledger go to ``folder``; the update spool to ``spool`` (a link from the
    state folder, so that it can live on another filesystem when the disk is short).
    """
    from lensemble.config.load import validate_mapping
    from lensemble.federation.coordinator import Coordinator
    from lensemble.federation.payload import bytes_hash, decode, encode
    from lensemble.federation.robustness import aggregate_spooled, decide
    from lensemble.federation.spool import UpdateSpool
    from lensemble.machinery.flat import flat_empty

    torch.set_num_threads(1)
    ids = [f"p{i:02d}" for i in range(n)]
    config = validate_mapping(
        {
            "federation": {"participants": [{"id": pid} for pid in ids], "quorum": n},
            "network": {"max_message_bytes": 1 << 34},
        }
    )
    theta0 = make_params(total)
    base = {k: 1e-3 * v for k, v in make_params(total, seed=1).items()}
    copy, digest = floors(theta0)
    mb = total * 4 / MB
    out: dict[str, float] = {"copy": copy, "hash": digest}
    spool.mkdir(parents=True, exist_ok=True)
    (folder / "state" / "coordinator").mkdir(parents=True)
    (spool / "round").mkdir()
    (folder / "state" / "coordinator" / "spool").symlink_to(spool / "round")
    coordinator = Coordinator(config, theta0, output_dir=folder / "state", signer=None)
    del theta0
    transport = SyntheticTransport(config, base)
    reset_peak_rss()  # the peak below is the rounds' (the floors' buffers came before)
    rounds_total, ledger_nc = [], []
    for _ in range(rounds):
        start, built = CLOCK(), transport.compute_clock
        record = coordinator.run_round(transport)
        rounds_total.append(CLOCK() - start - (transport.compute_clock - built))
        ledger_nc.append(record.non_compute_s)
    # The first round also creates the spool's files and the buffers later rounds reuse: it is
    # reported on its own, and the steady state is the median of the others.
    out["first_round_s"] = rounds_total[0]
    steady = slice(1, None) if rounds > 1 else slice(None)
    out["round_s"] = statistics.median(rounds_total[steady])
    out["round_ledger_s"] = statistics.median(ledger_nc[steady])
    out["rss_mb"] = peak_rss_bytes() / MB
    # Floors again after the rounds; the faster of the two (a shared machine's load varies).
    again = floors(make_params(total, seed=2))
    copy, digest = max(copy, again[0]), max(digest, again[1])
    out["copy"], out["hash"] = copy, digest
    out["round_floor_s"] = (n + 3) * mb * (1 / copy + 1 / digest)
    # The aggregation step alone, as the coordinator runs it at close (mean, no clipping).
    spilled = UpdateSpool(spool / "aggregation")
    norms = {}
    for i, pid in enumerate(ids):
        payload = encode({k: v * (1.0 + 0.01 * i) for k, v in base.items()}, {}, recycle=False)
        spilled.add(pid, payload, bytes_hash(payload), decode(payload, copy=False))
        norms[pid] = 1.0
        del payload
    shapes = {k: tuple(v.shape) for k, v in base.items()}
    screening = decide(norms, config.federation.robustness)
    robust = config.federation.robustness
    # Into one accumulator reused from call to call, as the coordinator keeps its own.
    acc = flat_empty(shapes)
    agg = best_of(
        lambda: aggregate_spooled(
            spilled, screening, shapes, robust, scheme="none", chunk=0, out=acc
        ),
        repeat=3,
    )
    spilled.close()
    out["spool_agg"] = n * mb / agg
    return out


def run_child(
    total: int, n: int, rounds: int, scratch: Path, spool_scratch: Path
) -> dict[str, float]:
    folder = Path(tempfile.mkdtemp(prefix=f"rt-{total}-{n}-", dir=scratch))
    spool = Path(tempfile.mkdtemp(prefix=f"rt-spool-{total}-{n}-", dir=spool_scratch))
    try:
        result = subprocess.run(
            [
                sys.executable,
                __file__,
                "--clock",
                "wall" if CLOCK is time.perf_counter else "cpu",
                "--child",
                f"{total},{n},{rounds},{folder},{spool}",
            ],
            check=True,
            capture_output=True,
            text=True,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(spool, ignore_errors=True)
    parsed: dict[str, float] = json.loads(result.stdout.strip().splitlines()[-1])
    return parsed


# ----------------------------------------------------------------------- the parent: the table
def in_process(total: int) -> dict[str, float]:
    from lensemble.federation.diloco import canonical_mean
    from lensemble.federation.payload import decode, encode, tensor_digest
    from lensemble.machinery.flat import flat_copy

    before = floors(make_params(total, seed=2))
    # The model as the coordinator holds it: views into one buffer (lensemble.machinery.flat).
    params = flat_copy(make_params(total))
    mb = total * 4 / MB
    data = encode(params, {})

    def parse() -> object:
        return decode(data, copy=False)

    t_encode = best_of(lambda: encode(params, {}))
    t_parse = best_of(parse)
    t_hash = best_of(lambda: tensor_digest(params))
    deltas = {f"p{i}": {k: v + i for k, v in params.items()} for i in range(4)}

    def mean() -> object:
        return canonical_mean(deltas)

    reduce = 4 * mb / best_of(mean, repeat=2)
    copy, digest = floors(params)  # right after the figures (and before them, above)
    copy, digest = max(copy, before[0]), max(digest, before[1])  # the faster: conservative
    return {
        "fresh": fresh_copy(params),
        "copy": copy,
        "hash": digest,
        "encode": mb / t_encode,
        "parse": mb / t_parse,
        "serialize": mb / (t_encode + t_parse),
        "model_hash": mb / t_hash,
        "reduce": reduce,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="10", help="millions of parameters, comma-separated")
    parser.add_argument("--participants", default="4,16", help="N values, comma-separated")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per child (median)")
    parser.add_argument("--scratch", type=Path, default=None, help="folder for the state")
    parser.add_argument(
        "--spool-scratch", type=Path, default=None, help="folder for the update spool"
    )
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu", help="what to time")
    parser.add_argument(
        "--memory-env",
        choices=["image", "as-is"],
        default="image",
        help="run with the image's huge-page environment (lensemble.machinery.hugepages), "
        "or as started",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_env == "image" and HUGEPAGE_ENV.keys() - os.environ.keys():
        # Both switches are read at process start (torch's at its first allocation, already
        # made by now): start again with the image's variables; those set are kept.
        env = {**HUGEPAGE_ENV, **os.environ}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    kept = keep_freed_buffers()  # as the lensemble command does for every command
    global CLOCK  # noqa: PLW0603 (one switch for every timing in this script)
    CLOCK = time.perf_counter if args.clock == "wall" else time.process_time
    if args.child:
        total, n, rounds, folder, spool = args.child.split(",", 4)
        print(json.dumps(child(int(total), int(n), int(rounds), Path(folder), Path(spool))))
        return
    torch.set_num_threads(1)
    # Absolute: the spool is a symlink from the state folder, resolved from there.
    scratch = (args.scratch or Path(tempfile.gettempdir())).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    if args.spool_scratch is not None:
        args.spool_scratch = args.spool_scratch.resolve()
        args.spool_scratch.mkdir(parents=True, exist_ok=True)
    print(
        f"torch {torch.__version__}, 1 intra-op thread; MB/s of float32 parameter bytes; "
        f"{args.clock} time; "
        + " ".join(f"{k}={os.environ.get(k, '')}" for k in sorted(HUGEPAGE_ENV))
        + f"; malloc keeps freed buffers: {'yes' if kept else 'no'}"
    )
    print(
        f"{'params':>6} | {'copy':>6} {'sha256':>6} | {'encode':>6} {'parse':>7} "
        f"{'serial':>6} {'x copy':>6} | {'fresh':>6} {'x fresh':>7} | {'hash':>5} {'x sha':>5} "
        f"{'x copy':>6} | {'reduce':>6} {'x copy':>6}"
    )
    for size in (int(s) for s in args.sizes.split(",")):
        r = in_process(size * 1_000_000)
        print(
            f"{size:>5}M | {r['copy']:>6.0f} {r['hash']:>6.0f} | {r['encode']:>6.0f} "
            f"{r['parse']:>7.0f} {r['serialize']:>6.0f} {r['serialize'] / r['copy']:>6.2f} | "
            f"{r['fresh']:>6.0f} {r['serialize'] / r['fresh']:>7.2f} | {r['model_hash']:>5.0f} "
            f"{r['model_hash'] / r['hash']:>5.2f} "
            f"{r['model_hash'] / r['copy']:>6.2f} | {r['reduce']:>6.0f} "
            f"{r['reduce'] / r['copy']:>6.2f}",
            flush=True,
        )
    print()
    print(
        f"{'params':>6} {'N':>3} | {'copy':>6} {'sha256':>6} | {'spool agg':>9} {'x copy':>6} "
        f"{'x c+h':>5} | {'first s':>7} {'round s':>7} {'ledger s':>8} {'floor s':>7} "
        f"{'x floor':>7} | {'peak RSS MB':>11} {'x model':>7} {'coord.':>6}"
    )
    for size in (int(s) for s in args.sizes.split(",")):
        for n in (int(x) for x in args.participants.split(",")):
            r = run_child(size * 1_000_000, n, args.rounds, scratch, args.spool_scratch or scratch)
            mb = size * 4
            both = 1 / (1 / r["copy"] + 1 / r["hash"])
            print(
                f"{size:>5}M {n:>3} | {r['copy']:>6.0f} {r['hash']:>6.0f} | "
                f"{r['spool_agg']:>9.0f} {r['spool_agg'] / r['copy']:>6.2f} "
                f"{r['spool_agg'] / both:>5.2f} | {r['first_round_s']:>7.2f} "
                f"{r['round_s']:>7.2f} {r['round_ledger_s']:>8.2f} {r['round_floor_s']:>7.2f} "
                f"{r['round_s'] / r['round_floor_s']:>7.2f} | {r['rss_mb']:>11.0f} "
                f"{r['rss_mb'] / mb:>7.2f} {r['rss_mb'] / mb - TRANSPORT_MODELS:>6.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
