"""The cost of one DP-SGD inner step against a plain AdamW step, in the same process.

On ``config/local.yaml`` (participant ``alpine``: 18 training episodes, batch 64, window 6),
times ``--steps`` inner steps of the plain learner and of the DP-SGD learner
(``lensemble.model.dp_sgd``: Poisson sample at ``q``, ``windows_per_record`` windows per record,
per-record gradients with ``torch.func``, Opacus' clipping and noise, the same AdamW), single
threaded as a participant trains, ``--repeats`` times in alternation, and prints the median
milliseconds per step of each and their ratio. The DP step at the defaults draws 0.25 * 18 = 4.5
records of 8 windows (36 windows) where the plain step takes 64:

    nice -n 10 python bench/dp_step.py --steps 50 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from lensemble.config import load_config
from lensemble.data.trajectories import load_or_collect
from lensemble.model.inner_loop import WorldModelLearner, initial_global_parameters

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    """Time both learners and print milliseconds per step."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="inner steps per timing")
    parser.add_argument("--repeats", type=int, default=5, help="timings of each learner")
    parser.add_argument("--sample-rate", type=float, default=0.25)
    parser.add_argument("--windows-per-record", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        privacy = (
            "federation.participants[0].privacy="
            f"{{epsilon: 8, sample_rate: {args.sample_rate}, "
            f"windows_per_record: {args.windows_per_record}}}"
        )
        config = load_config(REPO / "config" / "local.yaml", [f"run.output_dir={tmp}", privacy])
        pid = config.federation.participants[0].id
        data = load_or_collect(config, pid)
        theta = initial_global_parameters(config)
        plain = WorldModelLearner(config, pid, data)
        private = WorldModelLearner(config, pid, data, privacy=config.participant(pid).privacy)
        times: dict[str, list[float]] = {"plain": [], "dp-sgd": []}
        plain.train_round(theta, 0, 2)  # warm up both
        private.train_round(theta, 0, 2)
        for repeat in range(args.repeats):
            for name, learner in (("plain", plain), ("dp-sgd", private)):
                seconds = learner.train_round(theta, repeat + 1, args.steps).compute_seconds
                times[name].append(1000 * seconds / args.steps)
    plain_ms, dp_ms = statistics.median(times["plain"]), statistics.median(times["dp-sgd"])
    print(f"steps per timing {args.steps}, repeats {args.repeats}")
    for name, values in times.items():
        print(f"{name:7s} median {statistics.median(values):7.2f} ms/step  all {values}")
    print(f"dp-sgd / plain: {dp_ms / plain_ms:.2f}x")


if __name__ == "__main__":
    main()
