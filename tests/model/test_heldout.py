"""Held-out evaluation: the report, its determinism, and that its scores mean what they say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lensemble.config.schema import LensembleConfig
from lensemble.data.trajectories import ParticipantData, load_or_collect
from lensemble.errors import ArchitectureMismatch
from lensemble.eval.heldout import evaluate, probe_r2
from lensemble.model.inner_loop import initial_global_parameters, train_local_only
from lensemble.model.worldmodel import Params, build_model
from tests.model.conftest import small_config

Trained = tuple[LensembleConfig, dict[str, ParticipantData], Params]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """Two participants' data and a model trained on the first one's (8 rounds of 25 steps)."""
    config = small_config(tmp_path_factory.mktemp("heldout"))
    datasets = {pid: load_or_collect(config, pid) for pid in config.participant_ids}
    first = config.participant_ids[0]
    return config, datasets, train_local_only(config, first, datasets[first], 8, 25)


def test_report_lists_participants_and_union_as_plain_json(trained: Trained) -> None:
    config, datasets, params = trained
    report = evaluate(config, params, datasets)
    ids = sorted(datasets)
    assert list(report.participants) == ids and report.k_steps == 3
    # 2 held-out episodes of 40 steps: 38 starts each for a 3-step horizon.
    assert all(s.predictions == 2 * 38 for s in report.participants.values())
    assert report.union.predictions == 2 * 2 * 38
    as_json = json.loads(json.dumps(report.to_dict()))
    assert as_json == report.to_dict()
    assert set(as_json["union"]["probe_r2_per_dim"]) == {"theta", "theta_dot"}


def test_evaluation_is_deterministic(trained: Trained) -> None:
    config, datasets, params = trained
    assert (
        evaluate(config, params, datasets).to_dict() == evaluate(config, params, datasets).to_dict()
    )


def test_union_of_one_participant_is_that_participant(trained: Trained) -> None:
    config, datasets, params = trained
    pid = sorted(datasets)[0]
    report = evaluate(config, params, {pid: datasets[pid]})
    assert report.union.k_step_error == pytest.approx(report.participants[pid].k_step_error)
    assert report.union.probe_r2 == pytest.approx(report.participants[pid].probe_r2)


def test_k_step_error_matches_a_direct_computation(trained: Trained) -> None:
    config, datasets, params = trained
    pid, k = sorted(datasets)[1], config.evaluation.k_steps
    model = build_model(config, datasets[pid].spec)
    model.load_state_dict(params)
    errors, targets = [], []
    with torch.no_grad():
        for obs, actions in zip(
            datasets[pid].holdout.obs, datasets[pid].holdout.actions, strict=True
        ):
            for t in range(obs.shape[0] - k):
                z = model.encode(obs[t])
                for j in range(k):
                    z = model.predict(z, actions[t + j])
                target = model.encode(obs[t + k])
                errors.append(float((z - target).pow(2).sum()))
                targets.append(target.double())
    stacked = torch.stack(targets)
    expected = (sum(errors) / len(errors)) / float(stacked.var(dim=0, unbiased=False).sum())
    got = evaluate(config, params, datasets).participants[pid].k_step_error
    assert got == pytest.approx(expected, rel=1e-4)


def test_training_lowers_the_k_step_error(trained: Trained) -> None:
    config, datasets, params = trained
    pid = sorted(datasets)[0]
    untrained = evaluate(config, initial_global_parameters(config), datasets)
    after = evaluate(config, params, datasets)
    assert after.participants[pid].k_step_error < 0.5 * untrained.participants[pid].k_step_error


@pytest.mark.integration  # three seeds of training: seconds, not a quick check
def test_probe_of_a_trained_model_beats_an_untrained_one(tmp_path: Path) -> None:
    """With a 3-D latent (the pendulum's cos, sin and speed need all three), a random encoder
    loses information that training keeps; how much it loses depends on the draw, so the
    comparison averages three seeds. With a wide latent a random encoder of this state-based
    observation already keeps nearly everything, and there is little to beat."""
    before, after = [], []
    for seed in (7, 1, 2):
        config = small_config(tmp_path / str(seed), "model.latent_dim=3", f"run.root_seed={seed}")
        datasets = {pid: load_or_collect(config, pid) for pid in config.participant_ids}
        pid = config.participant_ids[0]
        params = train_local_only(config, pid, datasets[pid], 8, 25)
        untrained = initial_global_parameters(config)
        before.append(evaluate(config, untrained, datasets).participants[pid].probe_r2)
        after.append(evaluate(config, params, datasets).participants[pid].probe_r2)
    assert min(after) > 0.5
    assert sum(after) / 3 > sum(before) / 3 + 0.1


def test_probe_r2_is_one_for_a_linear_state_and_near_zero_for_noise() -> None:
    gen = torch.Generator().manual_seed(0)
    x_train, x_test = (
        torch.randn(400, 4, generator=gen, dtype=torch.float64),
        torch.randn(200, 4, generator=gen, dtype=torch.float64),
    )
    mix = torch.randn(4, 2, generator=gen, dtype=torch.float64)
    exact = probe_r2((x_train, x_train @ mix), (x_test, x_test @ mix), ridge=1e-6)
    assert torch.allclose(exact, torch.ones(2, dtype=torch.float64), atol=1e-4)
    noise = torch.randn(400, 2, generator=gen, dtype=torch.float64)
    unrelated = probe_r2((x_train, noise), (x_test, noise[:200]), ridge=1e-3)
    assert (unrelated < 0.1).all()


def test_parameters_of_another_model_are_refused(trained: Trained) -> None:
    config, datasets, params = trained
    with pytest.raises(ArchitectureMismatch, match="shape"):
        evaluate(config, {**params, "encoder.layers.2.bias": torch.zeros(5)}, datasets)
