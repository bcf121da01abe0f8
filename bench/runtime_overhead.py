"""Runtime overhead of a round, and throughput of its steps, against a memory-bandwidth floor.

For models of 1M, 10M and 100M float32 parameters and N = 4 and 16 participants, with learners
that do no compute (they return precomputed parameters), so the whole round is overhead:

- ``round ms``: non-compute wall time of one committed round over the in-process transport
  (model payload encode, per participant: decode + hash check + pseudo-gradient + quantize +
  residency seal; coordinator: hash check + decode + architecture check per submission, canonical
  mean, outer step, new model hash, atomic checkpoint, ledger line).
- throughput (MB/s of float32 parameter bytes) of serialization (safetensors encode + decode),
  of the canonical-order aggregation over N pseudo-gradients, and of the model hash;
- the floor: a plain numpy copy of the same bytes, measured in the same run; every throughput is
  also given as a ratio to that floor (1.0 = as fast as copying memory).

    python bench/runtime_overhead.py            # 1M and 10M, N = 4 and 16
    python bench/runtime_overhead.py --big      # adds 100M (needs ~14 GB RAM for N = 16)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch

from lensemble.config.load import validate_mapping
from lensemble.federation.coordinator import Coordinator
from lensemble.federation.diloco import canonical_mean
from lensemble.federation.inprocess import InProcessTransport
from lensemble.federation.participant import Participant
from lensemble.federation.payload import decode, encode, manifest, tensor_digest
from lensemble.learner import LocalRound

TENSOR = 1 << 20  # parameters per tensor: a model is a stack of 1M-element tensors


def make_params(total: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out, left, i = {}, total, 0
    while left > 0:
        n = min(TENSOR, left)
        out[f"layer.{i:04d}.weight"] = torch.randn(n, generator=g)
        left, i = left - n, i + 1
    return out


class NoComputeLearner:
    """Returns fixed local parameters: every measured second is overhead."""

    def __init__(self, local: Mapping[str, torch.Tensor]) -> None:
        self.local = dict(local)

    def train_round(self, global_params, round_index, steps):  # type: ignore[no-untyped-def]
        return LocalRound(self.local, 0.0, 0.0)

    def inner_state(self) -> dict[str, torch.Tensor]:
        return {}

    def load_inner_state(self, state) -> None:  # type: ignore[no-untyped-def]
        pass


def best_of(fn: Callable[[], object], repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def round_overhead_ms(total: int, n: int, quantization: str) -> float:
    ids = [f"p{i:02d}" for i in range(n)]
    config = validate_mapping(
        {
            "federation": {
                "participants": [{"id": pid} for pid in ids],
                "rounds": 2,
                "quorum": n,
                "quantization": quantization,
            },
            "network": {"max_message_bytes": 1 << 34},
        }
    )
    theta0 = make_params(total)
    arch = manifest(theta0)
    noise = make_params(total, seed=1)
    local = {k: theta0[k] - 1e-3 * noise[k] for k in theta0}
    del noise
    with tempfile.TemporaryDirectory() as tmp:
        participants = {
            pid: Participant(config, pid, NoComputeLearner(local), arch, None) for pid in ids
        }
        coordinator = Coordinator(config, theta0, output_dir=Path(tmp))
        transport = InProcessTransport(participants)
        records = [coordinator.run_round(transport) for _ in range(2)]
    return statistics.median(r.non_compute_s for r in records) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", action="store_true", help="also run 100M parameters")
    parser.add_argument("--quantization", default="none", choices=["none", "fp16", "bf16", "int8"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = [1_000_000, 10_000_000] + ([100_000_000] if args.big else [])
    print(f"torch {torch.__version__}, 1 intra-op thread, quantization {args.quantization}")
    header = (
        f"{'params':>6} {'N':>3} {'round ms':>9} {'ser MB/s':>9} {'x floor':>7} "
        f"{'agg MB/s':>9} {'x floor':>7} {'hash MB/s':>9} {'x floor':>7} {'floor MB/s':>10}"
    )
    print(header)
    for total in sizes:
        params = make_params(total)
        mb = total * 4 / 1e6
        flat = np.concatenate([t.numpy() for t in params.values()])
        dest = np.empty_like(flat)
        floor = mb / best_of(lambda d=dest, f=flat: np.copyto(d, f))
        data = encode(params, {})
        ser = mb / (best_of(lambda p=params: encode(p, {})) + best_of(lambda b=data: decode(b)))
        digest = mb / best_of(lambda p=params: tensor_digest(p))
        del data, flat, dest
        for n in (4, 16):
            # Distinct tensors per participant, so the reduction really streams N x the bytes.
            deltas = {f"p{i:02d}": {k: v + i for k, v in params.items()} for i in range(n)}
            agg = n * mb / best_of(lambda d=deltas: canonical_mean(d), repeat=2)
            del deltas
            overhead = round_overhead_ms(total, n, args.quantization)
            print(
                f"{total // 1_000_000:>5}M {n:>3} {overhead:>9.1f} {ser:>9.0f} {ser / floor:>7.2f} "
                f"{agg:>9.0f} {agg / floor:>7.2f} {digest:>9.0f} {digest / floor:>7.2f} "
                f"{floor:>10.0f}"
            )


if __name__ == "__main__":
    main()
