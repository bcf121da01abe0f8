"""A tiny deterministic learner and helpers to build a federation without the world model.

``QuadraticLearner`` pulls the parameters towards a participant-specific target with momentum
SGD on ``|theta - target|^2``: fast, deterministic, with real inner state (the velocity), so the
round machinery, DiLoCo maths, resume and faults can be tested in milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from lensemble.config import LensembleConfig
from lensemble.config.load import validate_mapping
from lensemble.errors import RankFailure, RankGroupExhausted
from lensemble.federation.coordinator import Coordinator
from lensemble.federation.faults import FaultPlan
from lensemble.federation.inprocess import InProcessTransport
from lensemble.federation.participant import Participant
from lensemble.federation.payload import manifest
from lensemble.learner import Learner, LocalRound
from lensemble.seeds import derive

SHAPES = {"encoder.weight": (3, 2), "encoder.bias": (3,), "predictor.weight": (2, 3)}


def initial_params(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(derive(seed, "test-init"))
    return {k: torch.randn(s, generator=g) for k, s in sorted(SHAPES.items())}


class QuadraticLearner:
    """Momentum SGD towards a participant's own target (its 'data')."""

    def __init__(self, participant_id: str, seed: int = 0, lr: float = 0.1) -> None:
        g = torch.Generator().manual_seed(derive(seed, f"target:{participant_id}"))
        self.target = {k: torch.randn(s, generator=g) for k, s in sorted(SHAPES.items())}
        self.velocity = {k: torch.zeros(s) for k, s in sorted(SHAPES.items())}
        self.lr = lr
        self.rounds_trained: list[int] = []

    def train_round(
        self, global_params: Mapping[str, torch.Tensor], round_index: int, steps: int
    ) -> LocalRound:
        params = {k: v.clone() for k, v in global_params.items()}
        losses = []
        for _ in range(steps):
            for k in params:
                grad = 2 * (params[k] - self.target[k])
                self.velocity[k] = 0.9 * self.velocity[k] + grad
                params[k] = params[k] - self.lr * self.velocity[k]
            losses.append(sum(float(((params[k] - self.target[k]) ** 2).sum()) for k in params))
        self.rounds_trained.append(round_index)
        return LocalRound(params, sum(losses) / len(losses), 0.0)

    def heldout_loss(self, global_params: Mapping[str, torch.Tensor]) -> float:
        """The squared distance to this participant's target: its 'held-out loss'."""
        return sum(
            float(((global_params[k].double() - self.target[k].double()) ** 2).sum())
            for k in sorted(self.target)
        )

    def inner_state(self) -> dict[str, torch.Tensor]:
        return {f"velocity.{k}": v.clone() for k, v in self.velocity.items()}

    def load_inner_state(self, state: Mapping[str, torch.Tensor]) -> None:
        self.velocity = {k: torch.zeros(s) for k, s in sorted(SHAPES.items())}
        self.velocity.update({k.removeprefix("velocity."): v.clone() for k, v in state.items()})


class RankFailingLearner(QuadraticLearner):
    """A ``QuadraticLearner`` that honours the ``rank_kill`` fault without any ranks.

    ``arm_rank_kill`` (what the in-process transport and a network participant call for
    ``rank_kill:ID@R``) makes the next ``train_round`` raise :class:`RankFailure` before it
    trains, as a rank group whose rank died reports the round lost with its inner state
    unchanged. So both transports can be driven through the same fault in milliseconds. As
    ``RankedLearner`` does, a failure beyond ``max_restarts`` raises
    :class:`RankGroupExhausted` instead.
    """

    def __init__(
        self, participant_id: str, seed: int = 0, lr: float = 0.1, max_restarts: int = 1
    ) -> None:
        super().__init__(participant_id, seed, lr)
        self.participant_id = participant_id
        self.max_restarts = max_restarts
        self._kill_next = -1
        self.failed_rounds: list[int] = []

    def arm_rank_kill(self, rank: int) -> None:
        self._kill_next = rank

    def train_round(
        self, global_params: Mapping[str, torch.Tensor], round_index: int, steps: int
    ) -> LocalRound:
        kill, self._kill_next = self._kill_next, -1
        if kill >= 0:
            self.failed_rounds.append(round_index)
            if len(self.failed_rounds) > self.max_restarts:
                raise RankGroupExhausted(
                    f"participant '{self.participant_id}' lost {len(self.failed_rounds)} rounds "
                    f"to dead ranks, more than max_restarts={self.max_restarts} (injected);",
                    remediation="none needed: a test fault.",
                )
            raise RankFailure(
                f"rank {kill} of participant '{self.participant_id}' died in round "
                f"{round_index} (injected);",
                remediation="none needed: a test fault.",
            )
        return super().train_round(global_params, round_index, steps)


#: The test federation's participants, deliberately not in sorted order.
PARTICIPANTS = ("delta", "alpha", "charlie", "bravo")


def small_federation(**federation: Any) -> dict[str, Any]:
    """The ``federation`` section of the test configs: 4 participants (alpha, bravo, charlie,
    delta, listed out of order), quorum 3, 3 rounds of 2 steps; ``federation`` overrides."""
    return {
        "participants": [{"id": pid} for pid in PARTICIPANTS],
        "rounds": 3,
        "inner_steps": 2,
        "quorum": 3,
        "round_timeout_s": 30,
        "join_timeout_s": 60,
        "max_round_retries": 1,
        "outer_optimizer": {"lr": 0.7, "momentum": 0.9, "nesterov": True},
        **federation,
    }


def small_config(**federation: Any) -> LensembleConfig:
    """A 4-participant config (see :func:`small_federation`), in process."""
    fed = small_federation(**federation)
    return validate_mapping(
        {"federation": fed, "network": {"rpc_timeout_s": 5}, "run": {"root_seed": 3}}
    )


def build(
    config: LensembleConfig,
    *,
    faults: FaultPlan | None = None,
    output_dir: Path | None = None,
    resume: bool = False,
    learner: Callable[[str, int], Learner] = QuadraticLearner,
) -> tuple[Coordinator, InProcessTransport, dict[str, Participant]]:
    params = initial_params(config.run.root_seed)
    arch = manifest(params)
    participants = {
        pid: Participant(config, pid, learner(pid, config.run.root_seed), arch, output_dir)
        for pid in config.participant_ids
    }
    coordinator = Coordinator(config, params, output_dir=output_dir, resume=resume)
    if resume:
        for p in participants.values():
            p.restore(coordinator.version)
    return coordinator, InProcessTransport(participants, faults), participants
