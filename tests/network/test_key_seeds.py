"""Seeds from a process's own TLS key: the coordinator's central-DP noise seed beside the others."""

from __future__ import annotations

from pathlib import Path

import pytest

from lensemble.config import load_config
from lensemble.errors import ConfigError
from lensemble.network.coordinator.noise_seed import central_noise_seed, coordinator_noise_seed
from lensemble.network.participant.privacy_seed import noise_seed
from lensemble.network.shared.identity import COORDINATOR_IDENTITY
from lensemble.network.shared.key_seeds import tls_key_seed
from tests.support.network import REPO, local_config_with_certs

CENTRAL = "federation.central_privacy={clip_norm: 0.3, noise_multiplier: 1.0}"


def test_the_coordinators_seed_is_its_keys_own_and_apart_from_every_other_use(
    tmp_path: Path,
) -> None:
    config = local_config_with_certs(
        tmp_path / "certs", CENTRAL, "federation.robustness.median_factor=null"
    )
    seed = central_noise_seed(config)
    assert seed == central_noise_seed(config) and 0 <= seed < 2**63
    # The same key under another salt (another use) gives other bits.
    assert seed != tls_key_seed(config, COORDINATOR_IDENTITY, b"x", needs_tls="", whose="")
    # Participants' noise seeds come from their own keys.
    assert seed not in {noise_seed(config, pid) for pid in config.participant_ids}
    # A new key gives a new seed: the key is the secret, not the config.
    other = local_config_with_certs(
        tmp_path / "again", CENTRAL, "federation.robustness.median_factor=null"
    )
    assert central_noise_seed(other) != seed
    # Under plain aggregation the coordinator passes it on; without central DP it has none.
    assert coordinator_noise_seed(config) == seed
    plain = local_config_with_certs(tmp_path / "plain")
    assert coordinator_noise_seed(plain) is None


def test_without_tls_the_seed_is_refused_naming_the_field() -> None:
    config = load_config(REPO / "config/local.yaml", ["network.tls.enabled=false"])
    with pytest.raises(ConfigError, match=r"network\.tls\.enabled.*central differential-privacy"):
        central_noise_seed(config)
