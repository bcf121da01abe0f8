"""Coordinator memory and round time of a masked round against a plain one, mTLS on loopback.

One real coordinator process and N real participant processes (``bench/network_transport.py``'s
no-compute learner: local parameters are the global ones scaled by a per-participant factor, so
the pseudo-gradient is small, within the masking clip, and nothing is trained) run ``--rounds``
rounds, every participant in every round (quorum N), once with ``federation.aggregation:
plain`` and once with ``masking``, at the same d and N. Reported: the coordinator's peak RSS
(``ru_maxrss``, as ``bench/coordinator_rss.py`` reads it), the ratio masked / plain (issue 37's
aim: at most 2), the size of one masked vector (``8 x (d + 2)`` bytes), the unit the
coordinator must not hold N of, and each run's median round time (the ledger's ``wall_s``,
opening to commit). Nothing is trained, so a round's time is all non-compute time: issue 37
aims at a masked round at most 2 x a plain one at d = 10M, N = 16. On one machine every
participant's masks are computed on the same cores, where a federation spreads them over N
hosts; read the masked time as an upper bound.

Run from the repository root (d = 1M and 10M, N = 4 and 8: about 10 minutes on 2 cores)::

    python bench/masking_rss.py --params 1M,10M --participants 4,8 --repeats 1

The same script runs against another checkout's code with ``PYTHONPATH=<checkout>/runtime``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import network_transport as nt

from lensemble.federation.ledger import Ledger
from lensemble.learner import LocalRound
from lensemble.network.launch.launcher import LocalFederation

HERE = Path(__file__).resolve()


class ScaleLearner:
    """No training: local parameters are the global ones scaled by a participant factor."""

    def __init__(self, index: int) -> None:
        self.factor = 1.0 - 1e-3 * (1 + index)

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


def run(total: int, n: int, rounds: int, aggregation: str) -> tuple[float, float]:
    """One run: the coordinator's peak RSS (MB) and the median round's ``wall_s`` (seconds)."""
    os.sync()
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        mapping = nt.config_mapping(tmp, rounds)
        fed_section = mapping["federation"]
        fed_section["participants"] = [{"id": f"p{i:02d}"} for i in range(n)]
        fed_section["quorum"] = n
        fed_section["aggregation"] = aggregation
        path, _ = nt.write_config(tmp, mapping)
        rss = tmp / "rss.json"
        program = [sys.executable, str(HERE), "_proc", str(total), str(rss)]
        with LocalFederation(path, [], tmp / "logs", program=program) as fed:
            coordinator = fed.start_coordinator()
            participants = [fed.start_participant(f"p{i:02d}") for i in range(n)]
            if coordinator.wait(3600) != 0:
                raise SystemExit(f"coordinator failed: {coordinator.last_error()}")
            for p in participants:
                if p.wait(120) != 0:
                    raise SystemExit(f"participant failed: {p.last_error()}")
        walls = [r.wall_s for r in Ledger(tmp / "run" / "ledger.jsonl").records()]
        return float(json.loads(rss.read_text())["peak_rss_mb"]), statistics.median(walls)


def _proc(argv: list[str]) -> None:
    """A LocalFederation child: the coordinator (writes its peak RSS) or a participant."""
    from lensemble.config import load_config
    from lensemble.network.launch.harness import PortOptions
    from lensemble.network.launch.process import run_coordinator, run_participant

    total, rss_file, *rest = argv
    parser = argparse.ArgumentParser()
    parser.add_argument("role")
    parser.add_argument("--config")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--id")
    parser.add_argument("--health-port", type=int)
    parser.add_argument("--metrics-port", type=int)
    args = parser.parse_args(rest)
    config = load_config(args.config, args.set)
    ports = PortOptions(None, args.health_port, args.metrics_port)
    params = int(total)
    if args.role == "coordinator":
        run_coordinator(config, lambda: nt.make_params(params), ports)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        Path(rss_file).write_text(json.dumps({"peak_rss_mb": peak}))
    else:
        torch.set_num_threads(1)
        index = config.participant_ids.index(args.id)
        theta0 = nt.make_params(params)
        run_participant(config, args.id, lambda: ScaleLearner(index), theta0, ports)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", default="1M,10M", help="model sizes, e.g. 1M,10M")
    parser.add_argument("--participants", default="4,8", help="values of N, e.g. 4,8")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    sizes = [nt.parse_count(s) for s in args.params.split(",")]
    counts = [int(s) for s in args.participants.split(",")]
    print(
        f"Coordinator peak RSS (MB) and median round time (s), mTLS loopback, {args.rounds} "
        f"rounds, no-compute participants, median of {args.repeats}; vector = one masked "
        "vector, 8 x (d + 2) bytes (MB)"
    )
    print(
        f"{'params':>7} {'N':>3} {'vector':>7} {'plain':>7} {'masked':>7} {'ratio':>6} "
        f"{'plain s':>8} {'masked s':>9} {'ratio':>6}"
    )
    for total in sizes:
        for n in counts:
            runs: dict[str, list[tuple[float, float]]] = {"plain": [], "masking": []}
            for _ in range(args.repeats):
                for aggregation, made in runs.items():
                    made.append(run(total, n, args.rounds, aggregation))
            plain = statistics.median(p for p, _ in runs["plain"])
            masked = statistics.median(p for p, _ in runs["masking"])
            plain_s = statistics.median(s for _, s in runs["plain"])
            masked_s = statistics.median(s for _, s in runs["masking"])
            print(
                f"{total / 1e6:>6.0f}M {n:>3} {8 * (total + 2) / 1e6:>7.0f} {plain:>7.0f} "
                f"{masked:>7.0f} {masked / plain:>6.2f} {plain_s:>8.2f} {masked_s:>9.2f} "
                f"{masked_s / plain_s:>6.2f}",
                flush=True,
            )


if __name__ == "__main__":
    from lensemble.machinery.allocator import keep_freed_buffers

    keep_freed_buffers()  # in every process of this bench, as the CLI does for every command
    if len(sys.argv) > 1 and sys.argv[1] == "_proc":
        _proc(sys.argv[2:])
    else:
        main()
