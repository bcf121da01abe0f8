"""``lensemble verify`` on a 1,000-round run: the whole process, and the walk alone.

Builds a 1,000-round run with the tiny test learner (real ledger, real checkpoints), then
times ``lensemble verify RUN_DIR`` as a process (median of 3 after a warm-up) and
:func:`lensemble.federation.verify.verify_run` in this process. Target: the process under 2 s.

    python bench/verify_ledger.py [--rounds 1000] [--signed] [--out DIR]

Build under ``nice`` if you like, but time the process at normal priority: a niced parent's
children inherit its niceness. ``--out DIR`` keeps the run (and reuses it when it exists).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lensemble.federation.coordinator import Coordinator  # noqa: E402
from lensemble.federation.signing import HmacSigner  # noqa: E402
from lensemble.federation.verify import verify_run  # noqa: E402
from tests.support.federation import build, initial_params, small_config  # noqa: E402


def main() -> None:
    """Build the run, time both, print one line each."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--signed", action="store_true", help="HMAC-sign the run and check it")
    parser.add_argument("--out", type=Path, help="keep the run here (reused when it exists)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        if (out / "ledger.jsonl").exists():
            _time(out, args)
            return
        # A gentle outer step: the toy learner must stay finite for a thousand rounds.
        outer = {"lr": 0.1, "momentum": 0.5, "nesterov": True}
        config = small_config(rounds=args.rounds, outer_optimizer=outer)
        _, transport, _ = build(config, output_dir=out)
        signer = HmacSigner(b"k" * 32) if args.signed else None
        coordinator = Coordinator(config, initial_params(3), output_dir=out, signer=signer)
        start = time.perf_counter()
        coordinator.run(transport)
        print(f"built {args.rounds} rounds in {time.perf_counter() - start:.1f} s")
        _time(out, args)


def _time(out: Path, args: argparse.Namespace) -> None:
    """Time the walk in this process and ``lensemble verify`` as a process."""
    signer = HmacSigner(b"k" * 32) if args.signed else None
    start = time.perf_counter()
    report = verify_run(out, signer=signer)
    walk = time.perf_counter() - start
    assert report.ok, report.first_break
    env_key = ["--key-file", str(out / "key")] if signer else []
    if signer:
        (out / "key").write_bytes(b"k" * 32)
    cmd = [str(Path(sys.executable).with_name("lensemble")), "verify", str(out), *env_key]
    subprocess.run(cmd, check=True, capture_output=True)  # warm-up
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        samples.append(time.perf_counter() - start)
    print(f"verify_run (in process): {walk:.3f} s for {report.lines} lines")
    print(f"lensemble verify (process, median of 3): {statistics.median(samples):.3f} s")


if __name__ == "__main__":
    main()
