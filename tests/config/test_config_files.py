"""The committed configs and schema: valid, in sync, usable by editors and Helm."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from lensemble.config import load_config
from lensemble.config.load import PACKAGED_DEFAULT
from tests.support.cli import run_cli

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "config").glob("*.yaml"))


def test_the_three_environments_exist() -> None:
    assert {c.stem for c in CONFIGS} >= {"local", "staging", "sovereign-prod"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_validates_and_matches_its_environment(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.deployment.environment == path.stem
    result = run_cli("config", "validate", str(path))
    assert result.code == 0, result.err
    assert result.out.startswith(f"ok {path}: environment={path.stem} ")
    assert "hash=sha256-canon-v1:" in result.out


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_starts_with_schema_modeline(path: Path) -> None:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first == "# yaml-language-server: $schema=./lensemble.schema.json"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_exported_schema_accepts_each_config(path: Path) -> None:
    schema = json.loads((path.parent / "lensemble.schema.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(yaml.safe_load(path.read_text()))


def test_exported_schema_rejects_unknown_keys_and_bad_enums(repo: Path) -> None:
    schema = json.loads((repo / "config/lensemble.schema.json").read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    assert list(validator.iter_errors({"federation": {"roundz": 3}}))
    assert list(validator.iter_errors({"federation": {"transport": "pigeon"}}))
    assert not list(validator.iter_errors({"federation": {"rounds": 3}}))


def test_schema_command_prints_draft_2020_12() -> None:
    result = run_cli("config", "schema")
    assert result.code == 0
    assert json.loads(result.out)["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_every_field_has_a_description(repo: Path) -> None:
    schema = json.loads((repo / "config/lensemble.schema.json").read_text(encoding="utf-8"))
    missing = []
    for name, definition in schema["$defs"].items():
        for field, spec in definition.get("properties", {}).items():
            if "description" not in spec and "$ref" not in spec:
                missing.append(f"{name}.{field}")
    assert not missing


def test_packaged_default_is_config_local(repo: Path) -> None:
    assert PACKAGED_DEFAULT.read_bytes() == (repo / "config/local.yaml").read_bytes()


def test_show_prints_resolved_yaml_with_hash(in_repo: Path) -> None:
    result = run_cli("config", "show", "config/staging.yaml")
    assert result.code == 0
    first, _, body = result.out.partition("\n")
    assert first.startswith("# config hash: sha256-canon-v1:")
    resolved = yaml.safe_load(body)
    # participant_count: 4 expanded into explicit participants with their own physics.
    assert [p["id"] for p in resolved["federation"]["participants"]] == [
        "site-0",
        "site-1",
        "site-2",
        "site-3",
    ]
    assert len({json.dumps(p["env_params"]) for p in resolved["federation"]["participants"]}) == 4
    # The resolved YAML is itself a valid config with the same hash.
    again = run_cli("config", "validate", "config/staging.yaml")
    assert first.removeprefix("# config hash: ") in again.out
