"""What secure aggregation (masking) costs in one process, against the plain fixed-point sum.

For each d (parameters) and n (participants), one session of ``lensemble.federation.secagg`` runs
in this process through its in-process driver (``secagg.local.run_session``: every message
encoded, sent and decoded), every participant taking part, and again with one participant
dropping out after sharing its keys (the coordinator then expands its pairwise masks with every
survivor). Reported (the minimum over ``--repeat`` runs, seconds of wall time on one core):

- ``client``: one participant's compute for the whole session (the mean over participants):
  key agreement, Shamir shares, fixed-point encoding, n keystreams of d words, signatures;
- ``server``: the coordinator's compute: checks, summing as vectors arrive, reconstructing the
  secrets and subtracting n self masks (plus n - 1 pairwise masks per dropped participant);
- ``one process``: all participants' and the coordinator's compute, one after another (what
  Flower's in-process SecAgg+ figure measures);
- ``plain``: the same without masking: each participant encodes (fixed point), the coordinator
  adds the n vectors; and the float32 sum of n vectors (the coordinator's plain reduction);
- bytes of every message kind (the masked upload against a float32 upload of 4 d bytes).

    nice -n 19 python bench/secagg.py                       # d = 1M, 10M; n = 4, 8, 16, 32
    nice -n 19 python bench/secagg.py --params 1M --n 20    # the Flower comparison point
    nice -n 19 python bench/secagg.py --flwr-python /tmp/flwr-venv/bin/python --params 1M --n 10,20

With ``--flwr-python``, Flower's SecAgg+ runs in that interpreter on the same d and n
(``bench/peer_flower_secagg.py``), as an optional peer.

``--precision`` measures instead the decoded mean's error: for each n, d, value scale and clip,
n float32 updates of normal values times the scale; the largest absolute difference, over all
coordinates, from their float64 mean, of (a) the float32 mean as the plain coordinator computes
it (a float32 sum in canonical order, then a division by n) and (b) the fixed-point mean (the
widest encoding for that clip and n, summed in Z_2^64, decoded in float64, rounded to float32).

    nice -n 19 python bench/secagg.py --precision
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from lensemble.federation.secagg.context import SessionContext, default_threshold
from lensemble.federation.secagg.fixed_point import FixedPoint
from lensemble.federation.secagg.keys import simulation_seed
from lensemble.federation.secagg.local import DropAfter, LocalResult, run_session

HERE = Path(__file__).resolve().parent


def parse_count(text: str) -> int:
    """``"10M"`` -> 10_000_000 (K, M suffixes)."""
    units = {"K": 10**3, "M": 10**6}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def session(n: int, d: int, *, dropped: bool, base: np.ndarray) -> LocalResult:
    roster = tuple(f"org-{i:02d}" for i in range(n))
    ctx = SessionContext(
        "bench", 0, 0, 0, roster, default_threshold(n), d, FixedPoint.widest(1.0, n)
    )
    keys = {p: ec.derive_private_key(1000 + i, ec.SECP256R1()) for i, p in enumerate(roster)}
    seeds = {p: simulation_seed(0, p) for p in roster}
    drop = {roster[1]: DropAfter.SHARE} if dropped else {}
    return run_session(ctx, lambda _p: base, seeds, keys, drop=drop)


def plain(n: int, d: int, base: np.ndarray) -> tuple[float, float, float]:
    """Seconds: one participant's encoding, the coordinator's uint64 sum and float32 sum of n."""
    codec = FixedPoint.widest(1.0, n)
    words = np.empty(d, dtype=np.uint64)
    start = time.perf_counter()
    codec.encode_into(base, words)
    encode = time.perf_counter() - start
    total = np.zeros(d, dtype=np.uint64)
    start = time.perf_counter()
    for _ in range(n):
        np.add(total, words, out=total)
    fixed_sum = time.perf_counter() - start
    floats = np.zeros(d, dtype=np.float32)
    start = time.perf_counter()
    for _ in range(n):
        np.add(floats, base, out=floats)
    float_sum = time.perf_counter() - start
    return encode, fixed_sum, float_sum


def measure(n: int, d: int, repeat: int) -> dict[str, object]:
    base = (np.random.default_rng(0).standard_normal(d) * 0.01).astype(np.float32)
    row: dict[str, object] = {"n": n, "d": d}
    for dropped in (False, True):
        best: LocalResult | None = None
        best_total = float("inf")
        for _ in range(repeat):
            result = session(n, d, dropped=dropped, base=base)
            total = sum(result.traffic.client_s.values()) + result.traffic.server_s
            if total < best_total:
                best, best_total = result, total
        assert best is not None
        clients = best.traffic.client_s
        key = "dropout" if dropped else "all"
        row[key] = {
            "client_mean_s": sum(clients.values()) / len(clients),
            "client_max_s": max(clients.values()),
            "server_s": best.traffic.server_s,
            "one_process_s": best_total,
        }
        if not dropped:
            row["bytes"] = {k: max(v) for k, v in best.traffic.bytes.items()}
    runs = [plain(n, d, base) for _ in range(repeat)]
    row["plain"] = {
        "encode_s": min(r[0] for r in runs),
        "fixed_sum_s": min(r[1] for r in runs),
        "float32_sum_s": min(r[2] for r in runs),
    }
    row["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def flower(python: str, n: int, d: int, repeat: int) -> dict[str, object] | None:
    """Flower's SecAgg+ on the same n and d, in its own interpreter (or None if it failed)."""
    out = subprocess.run(
        [
            python,
            str(HERE / "peer_flower_secagg.py"),
            "--n",
            str(n),
            "--d",
            str(d),
            "--repeat",
            str(repeat),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        print(
            f"Flower SecAgg+ failed at n={n}, d={d}: {out.stderr.strip()[-400:]}", file=sys.stderr
        )
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def precision(n: int, d: int, scale: float, clip: float) -> dict[str, float]:
    """Largest absolute errors of the float32 and the fixed-point means against float64."""
    rng = np.random.default_rng(n * 7 + d)
    codec = FixedPoint.widest(clip, n)
    exact = np.zeros(d, dtype=np.float64)
    float32_sum = np.zeros(d, dtype=np.float32)
    total = np.zeros(d, dtype=np.uint64)
    words = np.empty(d, dtype=np.uint64)
    clipped = 0
    for _ in range(n):
        update = (rng.standard_normal(d) * scale).astype(np.float32)
        exact += update
        float32_sum += update
        clipped += codec.encode_into(update, words)
        total += words
    exact /= n
    fixed64 = codec.decode_sum(total) / n
    return {
        "n": n,
        "d": d,
        "scale": scale,
        "clip": clip,
        "fractional_bits": codec.fractional_bits,
        "clipped": clipped,
        "float32_mean": float(np.max(np.abs(float32_sum / np.float32(n) - exact))),
        "fixed_point_float64": float(np.max(np.abs(fixed64 - exact))),
        "fixed_point_mean": float(np.max(np.abs(fixed64.astype(np.float32) - exact))),
    }


def precision_table(rows: list[dict[str, float]]) -> str:
    lines = [
        "| n | d | scale | clip | f | clipped | float32 mean | fixed point, float64 "
        "| fixed point, float32 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['n']} | {r['d']:,} | {r['scale']:g} | {r['clip']:g} | {r['fractional_bits']} | "
            f"{r['clipped']} | {r['float32_mean']:.2e} | {r['fixed_point_float64']:.2e} | "
            f"{r['fixed_point_mean']:.2e} |"
        )
    return "\n".join(lines)


def table(rows: list[dict[str, object]]) -> str:
    lines = [
        "| d | n | client (s) | server (s) | server, 1 dropped (s) | one process (s) "
        "| plain: encode + sum (s) | float32 sum (s) | masked upload (bytes) "
        "| Flower SecAgg+ one process (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        a, dr, p, b = r["all"], r["dropout"], r["plain"], r["bytes"]  # type: ignore[index]
        fl = r.get("flower")
        flower_cell = f"{fl['one_process_s']:.2f}" if isinstance(fl, dict) else "-"
        lines.append(
            f"| {r['d']:,} | {r['n']} | {a['client_mean_s']:.3f} | {a['server_s']:.3f} | "  # type: ignore[index]
            f"{dr['server_s']:.3f} | {a['one_process_s']:.2f} | "  # type: ignore[index]
            f"{p['encode_s'] + p['fixed_sum_s']:.3f} | {p['float32_sum_s']:.3f} | "  # type: ignore[index]
            f"{b['MaskedInput']:,} | {flower_cell} |"  # type: ignore[index]
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--params", default="1M,10M", help="comma-separated d values (K, M suffixes)"
    )
    parser.add_argument("--n", default="4,8,16,32", help="comma-separated participant counts")
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell; the fastest counts")
    parser.add_argument("--skip", default="", help="cells to skip, e.g. 10M:32")
    parser.add_argument("--flwr-python", default=None, help="an interpreter with flwr installed")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    parser.add_argument("--precision", action="store_true", help="measure the mean's error instead")
    args = parser.parse_args()
    if args.precision:
        cells = [
            precision(n, parse_count(d), scale, clip)
            for d in args.params.split(",")
            for n in (4, 16, 32)
            for scale, clip in ((1e-4, 1.0), (1e-2, 1.0), (1e-1, 1.0), (1.0, 8.0), (1e-2, 1024.0))
        ]
        print(precision_table(cells))
        return
    skip = {tuple(c.split(":")) for c in args.skip.split(",") if c}
    rows = []
    for d_text in args.params.split(","):
        for n_text in args.n.split(","):
            if (d_text, n_text) in skip:
                print(f"skipped d={d_text}, n={n_text}", file=sys.stderr)
                continue
            row = measure(int(n_text), parse_count(d_text), args.repeat)
            if args.flwr_python:
                row["flower"] = flower(
                    args.flwr_python, int(n_text), parse_count(d_text), args.repeat
                )
            print(json.dumps(row), file=sys.stderr)
            rows.append(row)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
