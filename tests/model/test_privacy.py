"""A participant's differential privacy: Opacus' accountant, its own budget, DP-SGD's bits."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from lensemble.config.schema import PrivacyConfig
from lensemble.errors import PrivacyBudgetExhausted
from lensemble.federation.messages import RoundOpening
from lensemble.model.inner_loop import initial_global_parameters
from lensemble.model.privacy_budget import PrivacyBudget, planned_noise_multiplier, spent_epsilon
from lensemble.ranks.learner import build_learner
from tests.model.conftest import MakeConfig, params_digest

opacus = pytest.importorskip("opacus", reason="needs the [dp] extra (Opacus)")

#: Participant 0's own privacy; sigma given, so no test here waits for its derivation.
OWN = (
    "federation.participants[0].privacy="
    "{epsilon: 8, noise_multiplier: 1.0, sample_rate: 0.5, windows_per_record: 2}"
)


@pytest.mark.parametrize(
    ("q", "sigma", "steps", "delta"),
    [(0.01, 1.1, 10_000, 1e-5), (0.25, 3.7, 500, 1e-5), (0.5, 1.0, 40, 1e-3)],
)
def test_rdp_epsilon_is_opacus_own_step_by_step_reference(
    q: float, sigma: float, steps: int, delta: float
) -> None:
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    reference = RDPAccountant()
    for _ in range(steps):
        reference.step(noise_multiplier=sigma, sample_rate=q)
    ours = spent_epsilon(sigma, q, steps, delta, "rdp")
    assert ours == pytest.approx(reference.get_epsilon(delta), rel=1e-12)
    # And the analysis the accountant wraps, at its default orders.
    orders = RDPAccountant.DEFAULT_ALPHAS
    rdp = compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=orders)
    eps, _ = get_privacy_spent(orders=orders, rdp=rdp, delta=delta)
    assert ours == pytest.approx(eps, rel=1e-12)


def test_prv_epsilon_is_opacus_prv_accountant() -> None:
    from opacus.accountants import PRVAccountant

    reference = PRVAccountant()
    for _ in range(200):
        reference.step(noise_multiplier=2.0, sample_rate=0.1)
    ours = spent_epsilon(2.0, 0.1, 200, 1e-5, "prv")
    assert ours == pytest.approx(reference.get_epsilon(1e-5), rel=1e-6)
    # PRV is the tighter accountant: never above RDP's bound.
    assert ours <= spent_epsilon(2.0, 0.1, 200, 1e-5, "rdp")


def test_spend_grows_with_steps_and_nothing_is_spent_before_the_first() -> None:
    assert spent_epsilon(1.0, 0.5, 0, 1e-5, "rdp") == 0.0
    spends = [spent_epsilon(1.0, 0.5, n, 1e-5, "rdp") for n in (1, 10, 100)]
    assert spends == sorted(spends) and spends[0] > 0
    # A target epsilon picks the noise that spends at most it over the planned steps, and
    # hardly less noise would spend more.
    privacy = PrivacyConfig(epsilon=3.0, sample_rate=0.25)
    sigma = planned_noise_multiplier(privacy, 500)
    assert spent_epsilon(sigma, 0.25, 500, privacy.delta, "rdp") <= 3.0
    assert spent_epsilon(sigma * 0.95, 0.25, 500, privacy.delta, "rdp") > 3.0
    assert (
        planned_noise_multiplier(privacy.model_copy(update={"noise_multiplier": 2.5}), 500) == 2.5
    )


def test_a_participant_at_its_budget_refuses_the_round_and_says_why(
    make_config: MakeConfig,
) -> None:
    privacy = make_config(OWN).federation.participants[0].privacy
    assert privacy is not None
    budget = PrivacyBudget("alpine", privacy, noise_multiplier=1.0)
    budget.require(1, round_index=0)  # affordable: one step spends less than 8
    budget.steps = 2_000
    with pytest.raises(PrivacyBudgetExhausted) as raised:
        budget.require(25, round_index=7)
    text = str(raised.value)
    assert "participant 'alpine' sits out round 7" in text
    assert "budget of 8" in text and "delta 1e-05" in text
    assert raised.value.code == "privacy_budget"


def test_a_private_round_is_bit_identical_on_a_rerun_and_reports_its_spend(
    make_config: MakeConfig,
) -> None:
    config = make_config(OWN)
    pid = config.participant_ids[0]
    theta = initial_global_parameters(config)
    first = build_learner(config, pid)
    a = first.train_round(theta, 1, 4)
    b = build_learner(config, pid).train_round(theta, 1, 4)
    assert params_digest(a.params) == params_digest(b.params)
    assert a.privacy_epsilon is not None and a.privacy_epsilon > 0
    assert a.privacy_epsilon == b.privacy_epsilon
    # No unprotected statistic of the training records is reported.
    assert math.isnan(a.mean_loss)
    # The spend is inner state: a snapshot carries it, as (sigma, q, steps).
    assert first.inner_state()["privacy.spend"].tolist() == [[1.0, 0.5, 4.0]]


def test_the_noise_is_the_secret_seed_s_and_a_private_round_differs_from_a_plain_one(
    make_config: MakeConfig,
) -> None:
    from lensemble.model.inner_loop import WorldModelLearner

    config = make_config(OWN)
    pid = config.participant_ids[0]
    theta = initial_global_parameters(config)
    own = build_learner(config, pid)
    assert isinstance(own, WorldModelLearner)
    privacy = own.privacy
    data = own.data
    other = WorldModelLearner(config, pid, data, privacy=privacy, noise_seed=12345)
    plain = WorldModelLearner(config, pid, data)
    digests = {
        params_digest(learner.train_round(theta, 0, 3).params) for learner in (own, other, plain)
    }
    assert len(digests) == 3


def test_the_participant_uses_its_own_section_and_the_coordinator_sends_none(
    make_config: MakeConfig,
) -> None:
    config = make_config(OWN)
    own, other = config.participant_ids[0], config.participant_ids[1]
    assert config.participant(own).privacy is not None
    assert config.participant(other).privacy is None
    learner = build_learner(config, own)
    assert learner.budget is not None  # type: ignore[attr-defined]
    assert learner.budget.privacy is config.participant(own).privacy  # type: ignore[attr-defined]
    assert build_learner(config, other).budget is None  # type: ignore[attr-defined]
    # What a coordinator sends to open a round carries no privacy setting to tamper with.
    sent = {f.name for f in dataclasses.fields(RoundOpening)}
    assert not {name for name in sent if "privacy" in name or "noise" in name or "eps" in name}
    assert sent == {
        "round_index",
        "attempt",
        "model_version",
        "model_hash",
        "deadline_s",
        "final",
        "base_hash",  # federation.overlap: a hash of a model the participant holds, no setting
    }


def test_a_record_s_gradient_depends_on_that_record_alone(make_config: MakeConfig) -> None:
    from lensemble.model.dp_sgd import per_record_gradients

    config = make_config(OWN)
    learner = build_learner(config, config.participant_ids[0])
    obs, actions = learner.data.train.obs, learner.data.train.actions  # type: ignore[attr-defined]
    w = config.data.window
    grads = per_record_gradients(
        learner.model,  # type: ignore[attr-defined]
        config,
        obs=obs[:3, None, : w + 1].expand(3, 2, w + 1, obs.shape[-1]),
        actions=actions[:3, None, :w].expand(3, 2, w, actions.shape[-1]),
        directions=torch.eye(config.model.latent_dim)[:, :2],
        target_encoder=None,
    )
    assert all(g.shape[0] == 3 for g in grads.values())
    # Each record's gradient is its own: the first record's alone gives the same gradient.
    alone = per_record_gradients(
        learner.model,  # type: ignore[attr-defined]
        config,
        obs=obs[:1, None, : w + 1].expand(1, 2, w + 1, obs.shape[-1]),
        actions=actions[:1, None, :w].expand(1, 2, w, actions.shape[-1]),
        directions=torch.eye(config.model.latent_dim)[:, :2],
        target_encoder=None,
    )
    for name, g in grads.items():
        torch.testing.assert_close(g[0], alone[name][0], rtol=1e-5, atol=1e-7)


def test_the_spend_never_goes_down_and_other_settings_compose(make_config: MakeConfig) -> None:
    privacy = make_config(OWN).federation.participants[0].privacy
    assert privacy is not None
    budget = PrivacyBudget("alpine", privacy, noise_multiplier=1.0, steps=30)
    budget.restore([(1.0, 0.5, 20)])  # an older snapshot: this process spent more
    assert budget.segments() == [(1.0, 0.5, 30)]
    # A snapshot taken at another sigma (a resume with other settings) is composed, not
    # counted at the new sigma.
    resumed = PrivacyBudget("alpine", privacy, noise_multiplier=2.0)
    resumed.restore([(1.0, 0.5, 30)])
    assert resumed.segments() == [(1.0, 0.5, 30), (2.0, 0.5, 0)]
    assert resumed.spent == pytest.approx(spent_epsilon(1.0, 0.5, 30, 1e-5, "rdp"))
    from opacus.accountants import RDPAccountant

    reference = RDPAccountant()
    for sigma, steps in ((1.0, 30), (2.0, 10)):
        for _ in range(steps):
            reference.step(noise_multiplier=sigma, sample_rate=0.5)
    assert resumed.epsilon_after(10) == pytest.approx(reference.get_epsilon(1e-5), rel=1e-12)
