"""The simulation's worker processes: the same learner, bit for bit, and failures said plainly."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from lensemble.config import LensembleConfig, load_config
from lensemble.data.trajectories import load_or_collect
from lensemble.errors import IntegrityError
from lensemble.model.inner_loop import initial_global_parameters
from lensemble.ranks.learner import build_learner
from lensemble.simulation.evaluation import Evaluation
from lensemble.simulation.workers import SimulationWorkers, TrainingProcessFailed
from tests.support.small_world import SMALL_WORLD_MODEL

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def config(tmp_path: Path) -> LensembleConfig:
    overrides = [
        "federation.participant_count=4",
        "federation.inner_steps=3",
        f"run.output_dir={tmp_path}",
        *SMALL_WORLD_MODEL,
    ]
    cfg = load_config(REPO / "config" / "local.yaml", overrides)
    for pid in cfg.participant_ids:
        load_or_collect(cfg, pid)  # as the simulation does before it starts its workers
    return cfg


@pytest.fixture
def workers(config: LensembleConfig) -> Iterator[SimulationWorkers]:
    started = SimulationWorkers(config, config.participant_ids, 2)
    yield started
    started.close()


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_learner_in_a_worker_trains_scores_and_keeps_state_as_one_built_here(
    config: LensembleConfig, workers: SimulationWorkers
) -> None:
    pid = config.participant_ids[1]
    here, there = build_learner(config, pid), workers.learners[pid]
    theta = initial_global_parameters(config)
    for round_index in range(2):
        local, remote = (learner.train_round(theta, round_index, 3) for learner in (here, there))
        assert _same(local.params, remote.params)
        assert local.mean_loss == remote.mean_loss
        assert here.heldout_loss(local.params) == there.heldout_loss(local.params)
        theta = local.params
    state = here.inner_state()
    assert state and _same(state, there.inner_state())
    # Back to the state after round 0 on both: round 1 again gives the same bits on both.
    here.load_inner_state({})
    there.load_inner_state({})
    assert _same(here.inner_state(), there.inner_state())


def test_an_error_in_the_worker_comes_back_as_its_own_class_and_message(
    config: LensembleConfig, workers: SimulationWorkers
) -> None:
    pid = config.participant_ids[0]
    bogus = {"optimizer.step.nothing": torch.zeros(())}
    with pytest.raises(IntegrityError) as local:
        build_learner(config, pid).load_inner_state(bogus)
    with pytest.raises(IntegrityError) as remote:
        workers.learners[pid].load_inner_state(bogus)
    assert str(remote.value) == str(local.value)
    assert remote.value.remediation == local.value.remediation


def test_a_killed_worker_is_named_with_its_signal_and_an_interrupt_does_not_stop_one(
    config: LensembleConfig, workers: SimulationWorkers
) -> None:
    first, second = (
        workers.learners[config.participant_ids[0]],
        workers.learners[config.participant_ids[1]],
    )
    os.kill(workers.pids[1], signal.SIGINT)  # Ctrl-C reaches every process of the terminal
    assert second.inner_state() == {}  # still answering: the simulation handles the interrupt
    os.kill(workers.pids[0], signal.SIGKILL)
    with pytest.raises(TrainingProcessFailed) as failed:
        first.inner_state()
    message = str(failed.value)
    assert f"participant '{config.participant_ids[0]}'" in message
    assert "exit code -9, killed by a signal" in message and "--workers" in message


def test_baselines_in_workers_score_as_baselines_trained_here(
    config: LensembleConfig, workers: SimulationWorkers
) -> None:
    here = Evaluation(config, workers=1)
    there = Evaluation(config, processes=workers)
    assert there.names == here.names
    for rounds in (1, 2):
        assert there.pooled_oracle(rounds) == here.pooled_oracle(rounds)
        assert there.local_only(rounds) == here.local_only(rounds)
    assert there.baseline("not-a-baseline", 1) is None


def test_closing_stops_every_worker(config: LensembleConfig) -> None:
    started = SimulationWorkers(config, config.participant_ids, 2)
    processes = list(started.processes)
    assert all(p.is_alive() for p in processes)
    started.close()
    started.close()  # idempotent
    assert not any(p.is_alive() for p in processes)
    assert all(p.exitcode == 0 for p in processes)
