"""The participant's learner: the Learner protocol, bit-identical results, DiLoCo inner state."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lensemble.data.trajectories import load_or_collect
from lensemble.errors import ArchitectureMismatch, IntegrityError
from lensemble.learner import Learner
from lensemble.model.inner_loop import (
    LocalOnlyRun,
    WorldModelLearner,
    build_learner,
    initial_global_parameters,
    train_local_only,
)
from lensemble.model.worldmodel import build_model
from tests.model.conftest import REPO, SMALL, MakeConfig, params_digest, small_config


def test_learner_implements_the_protocol(make_config: MakeConfig) -> None:
    config = make_config()
    learner = build_learner(config, config.participant_ids[0])
    assert isinstance(learner, Learner)
    result = learner.train_round(initial_global_parameters(config), 0, 3)
    assert result.mean_loss > 0 and result.compute_seconds > 0
    assert {k: v.shape for k, v in result.params.items()} == {
        k: v.shape for k, v in initial_global_parameters(config).items()
    }
    assert all(v.dtype == torch.float32 for v in result.params.values())


def test_train_round_is_bit_identical_whatever_ran_before(make_config: MakeConfig) -> None:
    config = make_config()
    pid = config.participant_ids[0]
    theta = initial_global_parameters(config)
    first = build_learner(config, pid).train_round(theta, 2, 10)
    # Disturb everything a careless implementation would depend on.
    torch.manual_seed(1234)
    torch.randn(100, 100) @ torch.randn(100, 100)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))
    try:
        second = build_learner(config, pid).train_round(theta, 2, 10)
        assert torch.get_num_threads() == max(2, threads)  # restored afterwards
    finally:
        torch.set_num_threads(threads)
    assert params_digest(first.params) == params_digest(second.params)
    assert first.mean_loss == second.mean_loss


_SUBPROCESS = """
import sys
from pathlib import Path
from lensemble.model.inner_loop import build_learner, initial_global_parameters
from tests.model.conftest import params_digest, small_config
config = small_config(Path(sys.argv[1]))
pid = config.participant_ids[0]
print(params_digest(build_learner(config, pid).train_round(initial_global_parameters(config), 2, 10).params))
"""


@pytest.mark.integration  # a child interpreter that imports torch and collects its own data
def test_train_round_is_bit_identical_in_a_fresh_process(tmp_path: Path) -> None:
    config = small_config(tmp_path / "here")
    pid = config.participant_ids[0]
    here = build_learner(config, pid).train_round(initial_global_parameters(config), 2, 10)
    # A separate output folder: the fresh process collects its own data too.
    out = subprocess.run(
        [sys.executable, "-c", _SUBPROCESS, str(tmp_path / "there")],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout.strip() == params_digest(here.params)
    assert SMALL  # the subprocess uses the same shrunk config


def test_rounds_and_participants_draw_different_batches(make_config: MakeConfig) -> None:
    config = make_config()
    a, b = config.participant_ids
    theta = initial_global_parameters(config)
    digests = {
        params_digest(build_learner(config, pid).train_round(theta, r, 5).params)
        for pid in (a, b)
        for r in (0, 1)
    }
    assert len(digests) == 4


@pytest.mark.parametrize("target", ["stop_gradient", "ema"])
def test_inner_state_carries_over_rounds_and_restores_exactly(
    make_config: MakeConfig, target: str
) -> None:
    config = make_config(f"model.target={target}")
    pid = config.participant_ids[0]
    data = load_or_collect(config, pid)
    theta = initial_global_parameters(config)
    uninterrupted = WorldModelLearner(config, pid, data)
    assert uninterrupted.inner_state() == {}
    theta_1 = uninterrupted.train_round(theta, 0, 5).params
    expected = uninterrupted.train_round(theta_1, 1, 5)

    before = WorldModelLearner(config, pid, data)
    before.train_round(theta, 0, 5)
    state = before.inner_state()
    assert any(k.startswith("optimizer.exp_avg_sq.encoder.") for k in state)
    assert any(k.startswith("ema.encoder.") for k in state) == (target == "ema")
    resumed = WorldModelLearner(config, pid, data)
    resumed.load_inner_state(state)
    got = resumed.train_round(theta_1, 1, 5)
    assert params_digest(got.params) == params_digest(expected.params)
    # Without the inner state the same round differs: the state really is carried.
    fresh = WorldModelLearner(config, pid, data).train_round(theta_1, 1, 5)
    assert params_digest(fresh.params) != params_digest(expected.params)


def test_foreign_inner_state_and_parameters_are_refused(make_config: MakeConfig) -> None:
    config = make_config()
    learner = build_learner(config, config.participant_ids[0])
    theta = initial_global_parameters(config)
    learner.train_round(theta, 0, 1)
    state = learner.inner_state()
    state["optimizer.exp_avg.encoder.layers.0.weight"] = torch.zeros(2, 2)
    with pytest.raises(IntegrityError, match=r"encoder\.layers\.0\.weight"):
        learner.load_inner_state(state)
    wrong = dict(theta)
    wrong["encoder.layers.9.weight"] = wrong.pop("encoder.layers.0.weight")
    with pytest.raises(ArchitectureMismatch, match="missing"):
        learner.train_round(wrong, 1, 1)


def test_local_only_baseline_trained_in_steps_equals_trained_at_once(
    make_config: MakeConfig,
) -> None:
    # The simulation evaluates the baseline every few rounds; stopping must change no bit.
    config = make_config()
    pid = config.participant_ids[0]
    data = load_or_collect(config, pid)
    stepwise = LocalOnlyRun(config, pid, data, steps=3)
    stepwise.train_until(1)
    stepwise.train_until(1)  # rounds already trained are not repeated
    stepwise.train_until(3)
    assert stepwise.rounds == 3
    at_once = train_local_only(config, pid, data, rounds=3, steps=3)
    assert params_digest(stepwise.params) == params_digest(at_once)
    assert params_digest(at_once) != params_digest(train_local_only(config, pid, data, 2, 3))


def test_loss_decreases_over_training(make_config: MakeConfig) -> None:
    config = make_config()
    learner = build_learner(config, config.participant_ids[0])
    params = initial_global_parameters(config)
    losses = []
    for r in range(8):
        result = learner.train_round(params, r, 25)
        params, losses = result.params, [*losses, result.mean_loss]
    assert losses[-1] < 0.5 * losses[0]


def _latent_std(config_dir: Path, *overrides: str) -> float:
    config = small_config(config_dir, *overrides)
    pid = config.participant_ids[0]
    data = load_or_collect(config, pid)
    params = train_local_only(config, pid, data, rounds=12, steps=25)
    model = build_model(config, data.spec)
    model.load_state_dict(params)
    with torch.no_grad():
        latents = model.encode(data.holdout.obs).reshape(-1, config.model.latent_dim)
    return float(latents.std(dim=0).mean())


@pytest.mark.integration  # 4 x 300 inner steps: seconds of training, not a quick check
@pytest.mark.parametrize("regularizer", ["vicreg", "sigreg"])
def test_anti_collapse_keeps_latent_variance_away_from_zero(
    tmp_path: Path, regularizer: str
) -> None:
    kept = _latent_std(tmp_path, f"model.regularizer={regularizer}")
    collapsed = _latent_std(
        tmp_path, f"model.regularizer={regularizer}", "model.regularizer_weight=0"
    )
    assert kept > 0.4
    assert collapsed < 0.2 * kept  # without the term the stop-gradient JEPA collapses
