"""Coordinator and participant processes with the tiny ``QuadraticLearner``, for fast tests.

Same command line as ``lensemble coordinator`` / ``lensemble participant`` and the same process
code (:mod:`lensemble.network.launch.process`); only the model differs (milliseconds per round instead
of the world model), plus one test hook: ``--block-round K --markers DIR`` makes the participant
stop inside its training of round K (it writes ``DIR/<id>-r<K>.blocked`` and waits for
``DIR/<id>-r<K>.release``), so a test can crash it, or its coordinator, at an exact point. A restarted
participant whose marker exists does not block again. ``--faults rank_kill:ID@R`` is applied as
``lensemble participant --faults`` applies it, to a learner that fails the round with
``RankFailure`` without launching ranks (``tests.support.federation.RankFailingLearner``).
``--train-s S`` makes every round's training take at least S seconds (a sleep), so a round
lasts long enough that scheduling noise is small against it. ``--die-at STAGE@R`` (masked
rounds) makes the participant process exit at once, without a goodbye, when the coordinator
sends it that secure-aggregation stage's message in round R: a crash at an exact stage.

    python -m tests.support.netproc coordinator --config C --set ... --health-port 0
    python -m tests.support.netproc participant --config C --id alpha [--block-round 1 --markers D]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from lensemble.cli.output import report_error
from lensemble.config import load_config
from lensemble.errors import EXIT_INTERRUPTED, LensembleError
from lensemble.federation.faults import participant_faults
from lensemble.learner import LocalRound
from tests.support.federation import QuadraticLearner, RankFailingLearner, initial_params

BLOCK_LIMIT_S = 120.0
#: Exit code of a participant that ``--die-at`` ended.
DIED = 86


class BlockingLearner:
    """Wraps a learner; blocks once inside the training of one round until released."""

    def __init__(self, inner: QuadraticLearner, pid: str, block_round: int, markers: Path) -> None:
        self.inner = inner
        self.block_round = block_round
        self.blocked = markers / f"{pid}-r{block_round}.blocked"
        self.release = markers / f"{pid}-r{block_round}.release"

    def train_round(
        self, global_params: Mapping[str, torch.Tensor], round_index: int, steps: int
    ) -> LocalRound:
        if round_index == self.block_round and not self.blocked.exists():
            self.blocked.write_text(str(os.getpid()))
            end = time.monotonic() + BLOCK_LIMIT_S
            while not self.release.exists() and time.monotonic() < end:
                time.sleep(0.05)
        return self.inner.train_round(global_params, round_index, steps)

    def heldout_loss(self, global_params: Mapping[str, torch.Tensor]) -> float | None:
        return self.inner.heldout_loss(global_params)

    def inner_state(self) -> dict[str, torch.Tensor]:
        return self.inner.inner_state()

    def load_inner_state(self, state: Mapping[str, torch.Tensor]) -> None:
        self.inner.load_inner_state(state)


class SlowLearner:
    """Wraps a learner; each round's training lasts at least ``train_s`` seconds."""

    def __init__(self, inner: QuadraticLearner | BlockingLearner, train_s: float) -> None:
        self.inner = inner
        self.train_s = train_s

    def train_round(
        self, global_params: Mapping[str, torch.Tensor], round_index: int, steps: int
    ) -> LocalRound:
        time.sleep(self.train_s)
        return self.inner.train_round(global_params, round_index, steps)

    def inner_state(self) -> dict[str, torch.Tensor]:
        return self.inner.inner_state()

    def load_inner_state(self, state: Mapping[str, torch.Tensor]) -> None:
        self.inner.load_inner_state(state)

    def heldout_loss(self, global_params: Mapping[str, torch.Tensor]) -> float | None:
        return self.inner.heldout_loss(global_params)


def _die_at(stage: str, round_index: str) -> None:
    """Make this participant process exit (as if killed) on ``stage``'s message of a round."""
    from lensemble.network.participant.masked_round import MaskedRounds

    start = MaskedRounds.__init__

    def init(self: MaskedRounds, *args: Any, **kwargs: Any) -> None:
        start(self, *args, **kwargs)

        def silent(key: Any, at: str) -> bool:
            if at == stage and key.round_index == int(round_index):
                os._exit(DIED)
            return False

        self.silent = silent

    MaskedRounds.__init__ = init  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    from lensemble.network.launch.harness import PortOptions
    from lensemble.network.launch.process import run_coordinator, run_participant
    from lensemble.network.shared.identity import resolve_participant_id
    from lensemble.network.shared.transport_errors import ShutdownRequested

    parser = argparse.ArgumentParser(prog="netproc")
    parser.add_argument("role", choices=["coordinator", "participant"])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--id", default=None)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--health-port", type=int, default=None)
    parser.add_argument("--metrics-port", type=int, default=None)
    parser.add_argument("--block-round", type=int, default=None)
    parser.add_argument("--markers", type=Path, default=None)
    parser.add_argument("--linger", action="store_true")
    parser.add_argument("--faults", default="")
    parser.add_argument("--train-s", type=float, default=0.0)
    parser.add_argument("--die-at", default=None)
    args = parser.parse_args(argv)
    if args.die_at:
        _die_at(*args.die_at.split("@"))
    try:
        config = load_config(args.config, args.overrides)
        ports = PortOptions(args.port, args.health_port, args.metrics_port)
        if args.role == "coordinator":
            seed = config.run.root_seed
            run_coordinator(config, lambda: initial_params(seed), ports, linger=args.linger)
            return 0
        theta0 = initial_params(config.run.root_seed)
        pid = resolve_participant_id(config, args.id, os.environ)
        faults = participant_faults(args.faults, config.participant_ids, pid)

        def learner() -> QuadraticLearner | BlockingLearner | SlowLearner:
            if faults.faults:
                return RankFailingLearner(pid, config.run.root_seed)
            plain = QuadraticLearner(pid, config.run.root_seed)
            inner = (
                plain
                if args.block_round is None
                else BlockingLearner(plain, pid, args.block_round, args.markers)
            )
            return SlowLearner(inner, args.train_s) if args.train_s > 0 else inner

        run_participant(config, pid, learner, theta0, ports, faults=faults)
        return 0
    except ShutdownRequested:
        return EXIT_INTERRUPTED
    except LensembleError as exc:
        report_error(exc)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
