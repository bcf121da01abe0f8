"""What a rerun round would leak under masking without the one-sum-per-update rule.

A retry of a round trains from the same global model on the same batches; only each
participant's inner optimizer state has moved on. A coordinator that unmasks the first attempt's
sum S_A over everyone, then a retry's sum S_B over everyone but a victim, holds S_A - S_B: the
victim's update plus how far the others' retrained updates moved. This trains
``config/local.yaml``'s world model (its participants, inner steps and data) from the initial
global model twice per round, as a first attempt and its retry, and prints for each victim the
relative error and the cosine between S_A - S_B and its true update, at round 0 (a fresh inner
state) and at round 5 (after four more rounds of inner state; they train from the initial model
too, which is all the measurement needs). docs/security.md (*one sum per update*) quotes it.

    python bench/retry_leak.py --seeds 7,11
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from lensemble.config import load_config
from lensemble.data.trajectories import load_or_collect
from lensemble.model.inner_loop import initial_global_parameters
from lensemble.ranks.learner import learner_for

REPO = Path(__file__).resolve().parent.parent


def _flat(params: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([params[k].flatten().double() for k in sorted(params)])


def measure(seed: int, data: Path) -> None:
    """Print each victim's leak at rounds 0 and 5 for one root seed."""
    config = load_config(
        str(REPO / "config" / "local.yaml"), [f"run.root_seed={seed}", f"run.output_dir={data}"]
    )
    theta = {k: v.float() for k, v in initial_global_parameters(config).items()}
    steps = config.federation.inner_steps
    ids = config.participant_ids
    learners = {p: learner_for(config, p, load_or_collect(config, p)) for p in ids}

    def update(pid: str, round_index: int) -> torch.Tensor:
        local = learners[pid].train_round(theta, round_index, steps)
        return _flat(theta) - _flat({k: v.float() for k, v in local.params.items()})

    for round_index in (0, 5):
        if round_index == 5:
            for learner in learners.values():
                for earlier in range(1, 5):
                    learner.train_round(theta, earlier, steps)
        first = {p: update(p, round_index) for p in ids}
        retry = {p: update(p, round_index) for p in ids}
        for victim in sorted(ids):
            leak = sum(first.values()) - sum(retry[p] for p in ids if p != victim)
            x = first[victim]
            relative = float((leak - x).norm() / x.norm())
            cosine = float(leak @ x / (leak.norm() * x.norm()))
            moved = float((retry[victim] - x).norm() / x.norm())
            print(
                f"seed {seed} round {round_index} victim {victim}: |S_A - S_B - x| / |x| "
                f"{relative:.3f}, cosine {cosine:.3f}; its own retried update moved {moved:.3f}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="7,11", help="Comma-separated root seeds.")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        for seed in (int(s) for s in args.seeds.split(",")):
            measure(seed, Path(tmp) / f"data-{seed}")


if __name__ == "__main__":
    main()
