"""Lensemble's network round against Flower's, side by side on this machine (optional).

Runs only where Flower is installed, in its own environment (it pins its own grpcio and
protobuf), e.g.::

    python3 -m venv /tmp/flwr-venv && /tmp/flwr-venv/bin/pip install flwr numpy
    nice -n 19 python bench/peer_flower.py --flwr-python /tmp/flwr-venv/bin/python

Both sides: N = 4 participant processes and one server process on loopback, float32
parameters in 8 tensors, near-zero local compute (a participant returns the global parameters
scaled by a constant), every participant in every round. Lensemble runs its network transport
(``transport: network``) in plaintext and with mutual TLS; Flower runs its gRPC server API
(``flwr.server.start_server`` / ``flwr.client.start_client``, FedAvg, no evaluation rounds).

Reported per system and size: the **round period**, the median of the seconds between two
consecutive round ends (Lensemble: the ledger's ``closed_at`` of consecutive commits; Flower: the
end of consecutive ``aggregate_fit`` calls), which covers everything a steady-state round costs
(for Lensemble: the previous round's checkpoint and ledger line, fsync'd on a commit thread beside
this round's collection and waited for before its aggregation, the opening, every model
download, the participants' work, every upload, validation, reduction and outer step), and the
server's **peak RSS** (``ru_maxrss`` of the coordinator / Flower server process). Each cell is the
median over ``--repeats`` interleaved repetitions (Lensemble, Flower, Lensemble, ...).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
N = 4
TENSORS = 8


def parse_count(text: str) -> int:
    """``"10M"`` -> 10_000_000 (K, M, G suffixes)."""
    units = {"K": 10**3, "M": 10**6, "G": 10**9}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def peak_rss_mb() -> float:
    """This process's peak resident set size (MB; Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------- Flower
def flower_server(port: int, total: int, rounds: int, out: Path) -> None:
    """Flower's gRPC server API with FedAvg; writes round end times and peak RSS to ``out``."""
    import flwr as fl
    import numpy as np

    ends: list[float] = []

    class Timed(fl.server.strategy.FedAvg):  # type: ignore[misc]
        def aggregate_fit(self, server_round, results, failures):  # type: ignore[no-untyped-def]
            result = super().aggregate_fit(server_round, results, failures)
            ends.append(time.perf_counter())
            return result

    size = total // TENSORS
    rng = np.random.default_rng(0)
    initial = [rng.standard_normal(size, dtype=np.float32) for _ in range(TENSORS)]
    strategy = Timed(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=N,
        min_evaluate_clients=0,
        min_available_clients=N,
        initial_parameters=fl.common.ndarrays_to_parameters(initial),
    )
    del initial
    fl.server.start_server(
        server_address=f"127.0.0.1:{port}",
        config=fl.server.ServerConfig(num_rounds=rounds),
        strategy=strategy,
        grpc_max_message_length=2**31 - 1,
    )
    out.write_text(json.dumps({"ends": ends, "peak_rss_mb": peak_rss_mb()}))


def flower_client(port: int, index: int) -> None:
    """A Flower client whose fit returns the global parameters scaled (no training)."""
    import flwr as fl

    factor = 1.0 - 1e-3 * (1 + index)

    class Scale(fl.client.NumPyClient):  # type: ignore[misc]
        def fit(self, parameters, config):  # type: ignore[no-untyped-def]
            return [p * factor for p in parameters], 1, {}

    fl.client.start_client(
        server_address=f"127.0.0.1:{port}",
        client=Scale().to_client(),
        grpc_max_message_length=2**31 - 1,
        insecure=True,
    )


def run_flower(python: str, total: int, rounds: int) -> tuple[list[float], float]:
    """Round periods (seconds) and server peak RSS (MB) of one Flower run."""
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "server.json"
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        server = subprocess.Popen(
            [python, str(HERE), "_flower_server", str(port), str(total), str(rounds), str(out)],
            **quiet,  # type: ignore[call-overload]
        )
        time.sleep(3)  # start_server has no readiness signal; clients retry anyway
        clients = [
            subprocess.Popen(
                [python, str(HERE), "_flower_client", str(port), str(i)],
                **quiet,  # type: ignore[call-overload]
            )
            for i in range(N)
        ]
        if server.wait(3600) != 0:
            raise SystemExit("the Flower server failed; rerun with its output to see why.")
        for client in clients:
            try:
                client.wait(60)
            except subprocess.TimeoutExpired:
                client.kill()
        result = json.loads(out.read_text())
    ends = result["ends"]
    return [b - a for a, b in itertools.pairwise(ends)], float(result["peak_rss_mb"])


# ------------------------------------------------------------------------------- Lensemble
def run_lensemble(total: int, rounds: int, tls: bool) -> tuple[list[float], float]:
    """Round periods (seconds) and coordinator peak RSS (MB) of one Lensemble network run."""
    sys.path.insert(0, str(HERE.parent))
    import network_transport as nt

    with tempfile.TemporaryDirectory() as folder:
        rss = Path(folder) / "rss.json"
        os.environ[nt.RSS_FILE_ENV] = str(rss)
        try:
            records = nt.network_round(total, rounds, tls=tls)
        finally:
            os.environ.pop(nt.RSS_FILE_ENV, None)
        return nt.round_periods(records), float(json.loads(rss.read_text())["peak_rss_mb"])


# ------------------------------------------------------------------------------------ main
def rounds_for(total: int) -> int:
    """Rounds per run: enough periods for a median, few enough at 50M to fit in minutes."""
    return 11 if total <= 2_000_000 else 6 if total <= 20_000_000 else 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", default="1M,10M,50M")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--flwr-python",
        default=shutil.which("python3") or sys.executable,
        help="a Python interpreter with flwr and numpy installed (its own venv)",
    )
    args = parser.parse_args()
    probe = subprocess.run(
        [args.flwr_python, "-c", "import flwr, numpy; print(flwr.__version__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        raise SystemExit(
            f"flwr is not importable by {args.flwr_python}; install it in its own venv "
            "(python3 -m venv /tmp/flwr-venv && /tmp/flwr-venv/bin/pip install flwr numpy) and "
            "pass --flwr-python /tmp/flwr-venv/bin/python."
        )
    flwr_version = probe.stdout.strip()
    systems = ("lensemble", "lensemble-mtls", "flower")
    cells: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for repeat in range(args.repeats):
        for text in args.params.split(","):
            total = parse_count(text)
            rounds = rounds_for(total)
            for system in systems:
                # Every run starts on a quiet disk: the writeback a previous (larger) run left
                # behind would otherwise slow the fsyncs of the next one (it made 1M rounds
                # after a 50M run 50% slower), which is the bench's doing, not the system's.
                os.sync()
                if system == "flower":
                    periods, rss = run_flower(args.flwr_python, total, rounds)
                else:
                    periods, rss = run_lensemble(total, rounds, tls=system.endswith("mtls"))
                median = statistics.median(periods)
                cells.setdefault((system, total), []).append((median, rss))
                print(
                    f"# repeat {repeat + 1} {text} {system}: round {median:.3f} s "
                    f"(periods {', '.join(f'{p:.3f}' for p in periods)}), peak RSS {rss:.0f} MB",
                    flush=True,
                )
    names = {
        "lensemble": "Lensemble network (plaintext)",
        "lensemble-mtls": "Lensemble network (mTLS)",
        "flower": f"Flower {flwr_version} gRPC server API (plaintext)",
    }
    print()
    print(
        "| params | system | round, median of repeats (s) | range over repeats (s) "
        "| server peak RSS (MB) |"
    )
    print("|---|---|---|---|---|")
    for text in args.params.split(","):
        total = parse_count(text)
        for system in systems:
            values = cells[(system, total)]
            rounds_s = [v[0] for v in values]
            print(
                f"| {text} | {names[system]} | {statistics.median(rounds_s):.3f} | "
                f"{min(rounds_s):.3f}–{max(rounds_s):.3f} | {max(v[1] for v in values):.0f} |"
            )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_flower_server":
        flower_server(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]))
    elif len(sys.argv) > 1 and sys.argv[1] == "_flower_client":
        flower_client(int(sys.argv[2]), int(sys.argv[3]))
    else:
        main()
