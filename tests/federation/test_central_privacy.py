"""Central user-level differential privacy (DP-FedAvg): clipping, noise, accounting, masking split.

Statistical checks draw from fixed seeds, so each is one deterministic outcome; the tolerances
are many standard errors wide (stated at each) so that they hold for any seed, yet a wrong
scale (a missing 1 / n, sqrt(m) for m) misses them by far.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from lensemble.config import load_config
from lensemble.config.hashing import config_hash, hashed_view
from lensemble.config.schema import LensembleConfig
from lensemble.federation.central_privacy import (
    RECORD_KEY,
    CentralAccount,
    add_noise,
    clip_screening,
    fewest_summed,
    noisy_share,
    planned_noise_multiplier,
    recorded_epsilon_problem,
    share_std,
    spent_epsilon,
)
from lensemble.federation.robustness import decide
from lensemble.federation.verify_history import HistoryReplay

pytestmark = pytest.mark.unit
opacus = pytest.importorskip("opacus", reason="needs the [dp] extra (Opacus)")

REPO = Path(__file__).resolve().parents[2]
CENTRAL = "federation.central_privacy={clip_norm: 0.5, noise_multiplier: 1.0}"
FIXED_BOUND = "federation.robustness.median_factor=null"


def _config(*overrides: str) -> LensembleConfig:
    return load_config(REPO / "config" / "local.yaml", list(overrides))


def test_clipping_bounds_every_contribution_on_top_of_the_screening() -> None:
    norms = {"a": 0.1, "b": 0.9, "c": 3.0, "d": 40.0}
    screening = decide(
        norms, _config(FIXED_BOUND, "federation.robustness.norm_bound=10").federation.robustness
    )
    assert screening.clipped == {"d": pytest.approx(10 / 40)}  # the screening's own bound
    set_by_dp = clip_screening(screening, 0.5)
    assert sorted(set_by_dp) == ["b", "c", "d"]
    for pid, norm in norms.items():
        assert norm * screening.clipped.get(pid, 1.0) <= 0.5 * (1 + 1e-12)
    assert "a" not in screening.clipped  # within C: untouched


def test_the_noise_on_the_mean_has_standard_deviation_z_c_over_n() -> None:
    # 2 * 10**5 draws: the sample std's relative standard error is 1 / sqrt(2N) = 0.16 %;
    # 2 % is over 12 standard errors, and a missing 1 / n (n = 4) would be 300 % off.
    z, c, n = 1.0, 0.5, 4
    combined = {"w": torch.zeros(400, 250), "b": torch.zeros(200, 500)}
    add_noise(combined, z * c / n, seed=7)
    values = torch.cat([t.flatten() for t in combined.values()]).double()
    assert float(values.std()) == pytest.approx(z * c / n, rel=0.02)
    assert abs(float(values.mean())) < 5 * (z * c / n) / math.sqrt(values.numel())
    again = {"w": torch.zeros(400, 250), "b": torch.zeros(200, 500)}
    add_noise(again, z * c / n, seed=7)
    assert all(torch.equal(again[k], combined[k]) for k in combined)  # the seed fixes the bits


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_epsilon_is_opacus_accountant_for_the_same_mechanism(accountant: str) -> None:
    from opacus.accountants import PRVAccountant, RDPAccountant

    reference = RDPAccountant() if accountant == "rdp" else PRVAccountant()
    for _ in range(12):
        reference.step(noise_multiplier=1.3, sample_rate=1.0)
    expected = reference.get_epsilon(delta=1e-5)
    assert spent_epsilon(1.3, 12, 1e-5, accountant) == pytest.approx(expected, rel=1e-9)
    assert spent_epsilon(1.3, 0, 1e-5, accountant) == 0.0


def test_noise_derived_from_a_budget_spends_at_most_it_over_the_planned_rounds() -> None:
    config = _config(
        FIXED_BOUND,
        "federation.central_privacy={clip_norm: 0.5, epsilon: 8}",
        "federation.rounds=20",
    )
    privacy = config.federation.central_privacy
    assert privacy is not None
    z = planned_noise_multiplier(privacy, 20)
    assert spent_epsilon(z, 20, privacy.delta, "rdp") <= 8.0
    assert spent_epsilon(z, 20, privacy.delta, "rdp") > 7.5  # the smallest z Opacus finds


def test_the_account_refuses_the_round_past_the_budget_and_says_why() -> None:
    config = _config(
        FIXED_BOUND,
        "federation.central_privacy={clip_norm: 0.5, noise_multiplier: 1.0, epsilon: 5}",
    )
    account = CentralAccount.of(config, [])
    assert account is not None
    # z = 1 at delta 1e-5 (RDP): one round spends 4.73, two 7.08.
    assert account.refusal(0) is None
    account.releases = 1
    refusal = account.refusal(1)
    assert refusal is not None
    assert "federation.central_privacy.epsilon 5" in refusal and "7.077" in refusal
    account.releases = 0
    entry = account.entry(noise_std=0.1, clipped={})
    assert recorded_epsilon_problem(entry) is None
    assert "spend" in str(recorded_epsilon_problem({**entry, "epsilon": 1.0}))


def test_verification_replays_the_release_count() -> None:
    from lensemble.federation.ledger import RoundRecord

    config = _config(FIXED_BOUND, CENTRAL)
    account = CentralAccount.of(config, [])
    assert account is not None
    entry = account.entry(noise_std=0.1, clipped={})

    def line(round_index: int, releases: int) -> RoundRecord:
        return RoundRecord(
            round=round_index,
            attempt=0,
            state="aborted",
            parent_hash="sha256:" + "0" * 64,
            model_hash="sha256:" + "0" * 64,
            contributors=["alpine", "coastal"],
            excluded={},
            mean_inner_loss=None,
            bytes_up=0,
            bytes_down=0,
            quantization="none",
            wall_s=0.0,
            compute_s=0.0,
            non_compute_s=0.0,
            config_hash=config_hash(config),
            defences={RECORD_KEY: {**entry, "releases": releases}},
        )

    replay = HistoryReplay()
    assert replay.check(line(0, 1)) is None
    assert "release 3" in str(replay.check(line(0, 3)))


def test_the_config_hash_leaves_out_central_privacy_while_it_is_null() -> None:
    plain = _config()
    assert "central_privacy" not in hashed_view(plain)["federation"]
    assert config_hash(plain) != config_hash(_config(FIXED_BOUND, CENTRAL))
    assert config_hash(_config(FIXED_BOUND)) != config_hash(_config(FIXED_BOUND, CENTRAL))


def _masked(*more: str) -> LensembleConfig:
    return _config(
        "federation.aggregation=masking",
        "federation.participant_count=6",
        "federation.quorum=4",
        CENTRAL,
        *more,
    )


def test_the_fewest_summed_is_what_a_masked_sum_needs() -> None:
    one_group = _masked("federation.masking.group_size=6")
    assert fewest_summed(one_group, 0) == max(4, 3, 2 * 6 // 3 + 1)  # max(quorum, 3, t) = 5
    two_groups = _masked("federation.masking.group_size=3")
    assert fewest_summed(two_groups, 0) == 3  # each group of 3 sums alone, t_g = 3


def test_the_split_noise_sums_to_the_full_noise_over_the_fewest_survivors() -> None:
    # m shares of d = 10**5 values: the sum's sample std has relative standard error 0.22 %;
    # 3 % is over 13 of them, and shares of z C (not z C / sqrt(m)) would be sqrt(5) = 224 % off.
    config = _masked("federation.masking.group_size=6")
    m = fewest_summed(config, 0)
    zero = np.zeros(100_000, dtype=np.float32)
    shares = [noisy_share(zero, config, bytes([i]) * 32, 0, 0) for i in range(m)]
    total = np.sum(np.stack(shares).astype(np.float64), axis=0)
    assert share_std(config, 0) == pytest.approx(1.0 * 0.5 / math.sqrt(m))
    assert float(total.std()) == pytest.approx(1.0 * 0.5, rel=0.03)
    # Each share is the participant's own: another secret or attempt draws other noise.
    assert np.array_equal(shares[0], noisy_share(zero, config, bytes([0]) * 32, 0, 0))
    assert not np.array_equal(shares[0], noisy_share(zero, config, bytes([0]) * 32, 0, 1))


def test_a_share_clips_the_update_to_clip_norm_before_its_noise() -> None:
    config = _masked("federation.masking.group_size=6")
    update = np.full(100_000, 0.1, dtype=np.float32)  # norm 31.6, far above C = 0.5
    share = noisy_share(update, config, b"s" * 32, 0, 0).astype(np.float64)
    noise = noisy_share(np.zeros_like(update), config, b"s" * 32, 0, 0).astype(np.float64)
    clipped = share - noise  # the same seed draws the same noise
    assert float(np.linalg.norm(clipped)) == pytest.approx(0.5, rel=1e-4)
    assert np.allclose(clipped, clipped[0], atol=1e-6)  # scaled, not reshaped (float32 rounding)
