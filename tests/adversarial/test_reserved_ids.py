"""Role names are not participant ids: a participant called 'coordinator' would share (and
``certs init`` would overwrite) the coordinator's certificate folder, token line and names."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from lensemble.config.load import validate_mapping
from lensemble.config.schema import RESERVED_PARTICIPANT_IDS
from lensemble.errors import ConfigError
from tests.support.cli import run_cli

REPO = Path(__file__).resolve().parents[2]


def _mapping(ids: list[str]) -> dict[str, object]:
    return {"federation": {"participants": [{"id": i} for i in ids]}}


@pytest.mark.parametrize("reserved", RESERVED_PARTICIPANT_IDS)
def test_a_role_name_is_refused_as_participant_id_naming_the_field(reserved: str) -> None:
    with pytest.raises(ConfigError) as caught:
        validate_mapping(_mapping(["alpine", reserved, "delta"]))
    text = str(caught.value)
    assert "federation.participants[1].id" in text
    assert f"'{reserved}' is a reserved role name" in text
    assert "choose another id" in text


def test_ordinary_ids_and_names_that_only_contain_a_role_are_accepted() -> None:
    config = validate_mapping(_mapping(["coordinator-eu", "all-hands", "alpine"]))
    assert config.participant_ids == ["all-hands", "alpine", "coordinator-eu"]


def test_the_json_schema_refuses_reserved_ids_too() -> None:
    schema = json.loads((REPO / "config/lensemble.schema.json").read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    bad = {"federation": {"participants": [{"id": "coordinator"}, {"id": "alpine"}]}}
    assert any("participants" in list(e.absolute_path) for e in validator.iter_errors(bad))
    good = {"federation": {"participants": [{"id": "coordinator-eu"}, {"id": "alpine"}]}}
    assert not list(validator.iter_errors(good))


def test_certs_init_never_runs_for_a_config_with_a_coordinator_participant(
    tmp_path: Path,
) -> None:
    result = run_cli(
        "certs",
        "init",
        str(tmp_path / "certs"),
        "--config",
        str(REPO / "config/local.yaml"),
        "--set",
        "federation.participants=[{id: coordinator}, {id: alpine}]",
    )
    assert result.code == 2, result.err
    assert "reserved role name" in result.err
    assert not (tmp_path / "certs").exists()
