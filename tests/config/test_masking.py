"""``federation.masking``: its defaults resolve as the secure-aggregation core computes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from lensemble.config import config_hash, differing_fields, load_config
from lensemble.config.federation_section import (
    MaskingConfig,
    default_threshold,
    widest_fractional_bits,
)
from lensemble.errors import ConfigError
from lensemble.federation.secagg import context, fixed_point

LOCAL = "config/local.yaml"
MASKING = "federation.aggregation=masking"


@pytest.mark.parametrize(("participants", "threshold"), [(4, 3), (8, 6)])
def test_a_null_threshold_resolves_to_two_thirds_plus_one(
    in_repo: Path, participants: int, threshold: int
) -> None:
    cfg = load_config(LOCAL, [MASKING, f"federation.participant_count={participants}"])
    n = len(cfg.federation.participants)
    assert n == participants
    assert cfg.federation.masking.threshold is None
    assert cfg.federation.masking.resolved_threshold(n) == threshold == 2 * n // 3 + 1


@pytest.mark.parametrize("participants", [4, 8])
def test_null_fractional_bits_resolve_to_the_widest_that_cannot_overflow(
    in_repo: Path, participants: int
) -> None:
    cfg = load_config(LOCAL, [MASKING, f"federation.participant_count={participants}"])
    bits = cfg.federation.masking.resolved_fractional_bits(participants)
    codec = fixed_point.FixedPoint(cfg.federation.masking.clip, bits)
    codec.check_headroom(participants)
    with pytest.raises(ConfigError, match="fractional_bits"):
        fixed_point.FixedPoint(cfg.federation.masking.clip, bits + 1).check_headroom(participants)


def test_set_values_are_used_as_given() -> None:
    masking = MaskingConfig(clip=0.5, fractional_bits=20, threshold=7, group_size=4)
    assert masking.resolved_threshold(8) == 7
    assert masking.resolved_fractional_bits(8) == 20


@pytest.mark.parametrize("participants", [1, 2, 3, 4, 5, 8, 9, 100, 1024])
@pytest.mark.parametrize("clip", [1e-3, 0.1, 1.0, 3.0, 1000.0, 1e6])
def test_the_config_computes_what_the_protocol_core_computes(
    participants: int, clip: float
) -> None:
    assert default_threshold(participants) == context.default_threshold(participants)
    assert widest_fractional_bits(clip, participants) == fixed_point.widest_bits(clip, participants)


def test_masking_parameters_leave_the_hash_of_a_plain_config_alone(in_repo: Path) -> None:
    plain = load_config(LOCAL)
    tuned = load_config(LOCAL, ["federation.masking.clip=0.25"])
    assert config_hash(tuned) == config_hash(plain)
    assert differing_fields(plain, tuned) == []


def test_masking_parameters_change_the_hash_of_a_masking_config(in_repo: Path) -> None:
    masked = load_config(LOCAL, [MASKING])
    tuned = load_config(LOCAL, [MASKING, "federation.masking.clip=0.25"])
    assert config_hash(masked) != config_hash(load_config(LOCAL))
    assert config_hash(tuned) != config_hash(masked)
    assert differing_fields(masked, tuned) == ["federation.masking.clip"]


def test_masking_validates_in_process_with_the_defaults(in_repo: Path) -> None:
    cfg = load_config(LOCAL, [MASKING])
    assert cfg.federation.aggregation == "masking"
    assert cfg.federation.masking == MaskingConfig()
