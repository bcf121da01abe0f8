"""Config hash, field differences, overrides and shorthands."""

from __future__ import annotations

from pathlib import Path

import pytest

from lensemble.config import config_hash, differing_fields, dump_config, load_config
from lensemble.config.load import validate_mapping
from lensemble.errors import ConfigError
from tests.support.cli import run_cli


@pytest.fixture
def local(in_repo: Path):  # type: ignore[no-untyped-def]
    return load_config("config/local.yaml")


def test_hash_names_its_algorithm(local) -> None:  # type: ignore[no-untyped-def]
    algo, _, digest = config_hash(local).partition(":")
    assert algo == "sha256-canon-v1"
    assert len(digest) == 64
    int(digest, 16)


@pytest.mark.parametrize(
    "override",
    [
        "federation.transport=network",
        "observability.log_level=DEBUG",
        "run.output_dir=/elsewhere",
        "network.port=6000",
        "deployment.environment=staging",
        "federation.round_timeout_s=90",
    ],
)
def test_hash_ignores_paths_logs_transport_and_deployment(in_repo: Path, local, override) -> None:  # type: ignore[no-untyped-def]
    other = load_config("config/local.yaml", [override])
    assert config_hash(other) == config_hash(local)
    assert differing_fields(local, other) == []
    assert differing_fields(local, other, hashed_only=False) != []


@pytest.mark.parametrize(
    ("override", "path"),
    [
        ("federation.inner_steps=7", "federation.inner_steps"),
        ("run.root_seed=8", "run.root_seed"),
        ("federation.participants[2].env_params.g=3.5", "federation.participants[2].env_params.g"),
        ("federation.quantization=int8", "federation.quantization"),
        ("model.latent_dim=8", "model.latent_dim"),
        ("federation.participant_count=5", "federation.participants"),
    ],
)
def test_hash_changes_with_results_and_diff_names_the_field(
    in_repo: Path, local, override, path
) -> None:  # type: ignore[no-untyped-def]
    other = load_config("config/local.yaml", [override])
    assert config_hash(other) != config_hash(local)
    assert path in differing_fields(local, other)


def test_hash_is_independent_of_yaml_layout(in_repo: Path, local, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # The resolved dump is a differently laid-out but equivalent file.
    file = tmp_path / "resolved.yaml"
    file.write_text(dump_config(local), encoding="utf-8")
    assert config_hash(load_config(file)) == config_hash(local)


def test_diff_command(in_repo: Path) -> None:
    same = run_cli("config", "diff", "config/local.yaml", "config/local.yaml")
    assert same.code == 0
    assert same.out.startswith("same: sha256-canon-v1:")
    different = run_cli("config", "diff", "config/local.yaml", "config/staging.yaml")
    assert different.code == 1
    assert "federation.inner_steps: 25 -> 50" in different.out.splitlines()


def test_participant_count_truncates_and_extends(in_repo: Path) -> None:
    two = load_config(
        "config/local.yaml", ["federation.participant_count=2", "federation.quorum=0"]
    )
    assert [p.id for p in two.federation.participants] == ["alpine", "coastal"]
    assert two.federation.quorum == 2
    six = load_config(
        "config/local.yaml", ["federation.participant_count=6", "federation.quorum=0"]
    )
    ids = [p.id for p in six.federation.participants]
    assert ids[:4] == ["alpine", "coastal", "highland", "delta"]
    assert ids[4:] == ["site-0", "site-1"]
    assert six.federation.quorum == 4  # strict majority of 6
    physics = {tuple(sorted(p.env_params.items())) for p in six.federation.participants}
    assert len(physics) == 6  # every site non-IID


def test_explicit_quorum_above_truncated_count_is_reported(in_repo: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config("config/local.yaml", ["federation.participant_count=2"])
    assert info.value.problems[0].path == "federation.quorum"


def test_defaults_alone_are_valid() -> None:
    cfg = validate_mapping({})
    assert len(cfg.federation.participants) == 4
    assert cfg.federation.quorum == 3
    assert all(p.trust_domain == p.id for p in cfg.federation.participants)


def test_set_accepts_list_indexes_and_flow_values(in_repo: Path) -> None:
    cfg = load_config(
        "config/local.yaml",
        [
            "federation.participants.1.region=eu-west-1",
            "federation.participants[0].env_params={g: 7.0}",
            "federation.inner_optimizer.betas=[0.8, 0.99]",
        ],
    )
    assert cfg.federation.participants[1].region == "eu-west-1"
    assert cfg.federation.participants[0].env_params == {"g": 7.0}
    assert cfg.federation.inner_optimizer.betas == (0.8, 0.99)


def test_config_is_frozen(local) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(Exception, match="frozen"):
        local.federation.rounds = 3


def test_canonical_participant_order(local) -> None:  # type: ignore[no-untyped-def]
    assert local.participant_ids == sorted(p.id for p in local.federation.participants)
    assert local.participant("delta").trust_domain == "delta-motion"
