"""The baselines a federated run is judged against, trained next to it on one machine.

- **local-only**: each participant trains alone (:class:`lensemble.model.inner_loop.LocalOnlyRun`);
  the best of them is the bar a consortium member compares with.
- **pooled-data oracle** (:class:`PooledRun`): one model trained on the union of every
  participant's training episodes with the same total inner steps as the federation
  (``N * H`` per round): what training would reach if residency did not matter.
- **FedAvg** (:class:`DilocoRun` with :data:`FEDAVG`): the same federation with the outer
  optimizer reduced to plain averaging (outer learning rate 1, no momentum) of the updates as
  they are (no norm bound), the ablation of DiLoCo's outer Nesterov step. Its updates cross the
  same wire format (``federation.quantization``) as the federation's.

Every baseline starts from the federated run's initial parameters, draws its batches from seeds
derived from ``run.root_seed``, and trains incrementally: ``train_until(r)`` continues from the
rounds already trained, so evaluating a baseline every round costs no more than training it once.
Only this harness builds them: it reads every participant's data, which stands for each
participant training inside its own trust domain (and, for the oracle, for a world without
residency).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from lensemble.federation.diloco import OuterStep, canonical_mean, pseudo_gradient, zeros_like
from lensemble.federation.payload import manifest
from lensemble.federation.quantization import dequantize, quantize
from lensemble.federation.robustness import (
    aggregate,
    cosine,
    lift_to_floor,
    momentum_shortfalls,
    screen,
    update_norm,
)
from lensemble.model.inner_loop import (
    LocalOnlyRun,
    SoloRun,
    WorldModelLearner,
    initial_global_parameters,
)

if TYPE_CHECKING:
    from lensemble.config import LensembleConfig
    from lensemble.data.trajectories import ParticipantData

Params = dict[str, torch.Tensor]

#: FedAvg as a DiLoCo outer step: the new global model is the mean of the local models.
FEDAVG = OuterStep(lr=1.0, momentum=0.0, nesterov=False)

#: The prefix of a local-only baseline's name (:func:`baseline_run`).
LOCAL_ONLY = "local_only:"

#: The pooled oracle's learner id; it seeds the oracle's batches.
POOLED_ID = "pooled-oracle"


def pooled_data(datasets: Mapping[str, ParticipantData]) -> ParticipantData:
    """Every participant's training episodes in one set (sorted id order), held-out ones too.

    Raises:
        ValueError: ``datasets`` is empty.
    """
    from lensemble.data.trajectories import ParticipantData, Trajectories

    if not datasets:
        raise ValueError("pooled_data() needs at least one participant's data")
    ids = sorted(datasets)

    def cat(split: str) -> Trajectories:
        parts = [getattr(datasets[p], split) for p in ids]
        return Trajectories(
            torch.cat([t.obs for t in parts]),
            torch.cat([t.actions for t in parts]),
            torch.cat([t.states for t in parts]),
        )

    first = datasets[ids[0]]
    return ParticipantData(
        participant_id=POOLED_ID,
        train=cat("train"),
        holdout=cat("holdout"),
        spec=first.spec,
        cache_path=first.cache_path,
    )


class PooledRun(SoloRun):
    """The pooled-data oracle: one learner on everyone's training data, ``N * H`` steps a round.

    Args:
        config: The run's config (``federation.inner_steps``, the inner optimizer, the model).
        datasets: Participant id -> its data; ``N = len(datasets)``.
    """

    def __init__(self, config: LensembleConfig, datasets: Mapping[str, ParticipantData]) -> None:
        learner = WorldModelLearner(config, POOLED_ID, pooled_data(datasets))
        steps = config.federation.inner_steps * len(datasets)
        super().__init__(learner, initial_global_parameters(config), steps)


class DilocoRun:
    """A fault-free DiLoCo federation of every participant, in memory, with a given outer step.

    The arithmetic is the coordinator's (:func:`~lensemble.federation.diloco.pseudo_gradient`,
    each update encoded in ``federation.quantization`` and decoded as the coordinator receives
    it, the norm bound and aggregator of ``federation.robustness``
    (:mod:`lensemble.federation.robustness`), :class:`OuterStep`), without the ledger,
    checkpoints, transport, divergence guard or suspicion scores; with the config's own outer
    step (and ``scheduled``) it reproduces the federated run's global models when no fault is
    injected and the guard never rolls back.

    Args:
        config: The run's config.
        datasets: Participant id -> its data.
        outer: The outer step (:data:`FEDAVG` for the FedAvg ablation).
        robust: Combine the updates as the coordinator does (``federation.robustness``); False
            takes their plain canonical mean (FedAvg's definition: the mean of the local
            models).
        scheduled: Step as ``federation.outer_optimizer``'s half-lives schedule ``outer`` for
            each version, as the coordinator does; False keeps ``outer`` constant (FedAvg).

    Attributes:
        contributors: Per round trained, the ids whose updates were combined (sorted): the
            kept contributors whose held-out reports score the round's starting version
            (:mod:`lensemble.federation.keep_best`).
    """

    def __init__(
        self,
        config: LensembleConfig,
        datasets: Mapping[str, ParticipantData],
        outer: OuterStep,
        *,
        robust: bool = True,
        scheduled: bool = False,
    ) -> None:
        fed = config.federation
        self.learners = {pid: WorldModelLearner(config, pid, datasets[pid]) for pid in datasets}
        self.params: Params = {
            k: v.to(torch.float32) for k, v in initial_global_parameters(config).items()
        }
        self.momentum = zeros_like(self.params)
        self.outer = outer
        opt = fed.outer_optimizer
        self.half_lives = (
            (opt.lr_half_life_rounds, opt.momentum_half_life_rounds, opt.lr_hold_rounds)
            if scheduled
            else (None, None, None)
        )
        self.steps = fed.inner_steps
        self.robustness = fed.robustness if robust else None
        self.wire = (fed.quantization, fed.int8_chunk)
        self.architecture = manifest(self.params)
        self.contributors: list[tuple[str, ...]] = []
        self.rounds = 0

    def train_until(self, rounds: int) -> Params:
        """Run the rounds not run yet, up to ``rounds`` in all; return the global parameters."""
        for round_index in range(self.rounds, rounds):
            deltas = {
                pid: self._over_the_wire(
                    pseudo_gradient(
                        self.params,
                        learner.train_round(self.params, round_index, self.steps).params,
                    )
                )
                for pid, learner in sorted(self.learners.items())
            }
            combined = self._combine(deltas)
            # The model version stepped from is the number of rounds before this one.
            step = self.outer.at(round_index, *self.half_lives)
            self.params, self.momentum = step.apply(self.params, combined, self.momentum)
        self.rounds = max(self.rounds, rounds)
        return self.params

    def _over_the_wire(self, delta: Params) -> Params:
        """The update as the coordinator decodes it from ``federation.quantization``."""
        scheme, chunk = self.wire
        if scheme == "none":
            return delta  # float32 on the wire: the same tensors
        return dequantize(quantize(delta, scheme, chunk), self.architecture, scheme, chunk)

    def _combine(self, deltas: Mapping[str, Params]) -> Params:
        """The coordinator's combination of a round's updates (or their plain mean)."""
        if self.robustness is None:
            self.contributors.append(tuple(sorted(deltas)))
            return canonical_mean(deltas)
        screening = screen(deltas, self.robustness)
        self.contributors.append(tuple(screening.kept_ids))
        reference = update_norm(self.momentum)
        cosines = {
            pid: cosine(deltas[pid], screening.norms[pid], self.momentum, reference)
            for pid in sorted(deltas)
        }
        floor = self.robustness.momentum_cosine_floor
        screening.shortfalls = momentum_shortfalls(screening, cosines, floor)
        combined = aggregate(screening.kept, self.robustness)
        lift_to_floor(combined, self.momentum, screening)
        return combined


def baseline_run(
    config: LensembleConfig, datasets: Mapping[str, ParticipantData], name: str
) -> LocalOnlyRun | PooledRun | DilocoRun:
    """The baseline called ``name``: ``local_only:<participant id>``, ``pooled`` or ``fedavg``.

    Each has ``train_until(rounds) -> params``
    (:class:`~lensemble.model.inner_loop.LocalOnlyRun`,
    :class:`PooledRun`, :class:`DilocoRun` with :data:`FEDAVG`).

    Raises:
        ValueError: No baseline has that name.
    """
    pid = name.removeprefix(LOCAL_ONLY)
    if name.startswith(LOCAL_ONLY) and pid in datasets:
        return LocalOnlyRun(config, pid, datasets[pid], config.federation.inner_steps)
    if name == "pooled":
        return PooledRun(config, datasets)
    if name == "fedavg":
        return DilocoRun(config, datasets, FEDAVG, robust=False)
    raise ValueError(f"no baseline is called {name!r}")
