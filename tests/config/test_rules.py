"""The registry of cross-field rules: every rule has a breaking example that it alone reports.

The chart's side of the same examples is ``tests/k8s/test_chart_config_rules.py``.
"""

from __future__ import annotations

import pytest

from lensemble.config.load import validate_mapping
from lensemble.config.rule_language import NotExpressible, parsed
from lensemble.config.rule_scopes import ENCLOSING, SCOPE_NAMES, Rule
from lensemble.config.rules import RULES, schema_of
from lensemble.config.schema import LensembleConfig
from lensemble.errors import ConfigError
from tests.config.rule_examples import BREAKING, edited_values, field_pattern

RULE_IDS = [rule.id for rule in RULES]


def test_rule_ids_are_unique() -> None:
    assert len(set(RULE_IDS)) == len(RULE_IDS)


def test_every_rule_has_a_breaking_example_and_no_example_is_stale() -> None:
    assert sorted(set(RULE_IDS) - set(BREAKING)) == [], "add a breaking example for these rules"
    assert sorted(set(BREAKING) - set(RULE_IDS)) == [], "these examples name no rule"


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
def test_a_rule_is_written_in_the_rule_language(rule: Rule) -> None:
    for text in (rule.require, rule.when):
        if text is not None:
            parsed(text)


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
def test_the_example_breaks_its_rule_naming_the_field(rule: Rule) -> None:
    example = BREAKING[rule.id]
    assert field_pattern(rule.field).fullmatch(example.field), (rule.field, example.field)
    with pytest.raises(ConfigError) as raised:
        validate_mapping(edited_values(example.case, example.edits)["config"])
    assert [p.path for p in raised.value.problems] == [example.field, *example.also]


def test_the_examples_start_from_valid_configs() -> None:
    for case in sorted({example.case for example in BREAKING.values()}):
        edited_values(case, ())  # rendered from a valid config
        validate_mapping(edited_values(case, ())["config"])


def test_json_schema_forms_are_in_the_config_schema() -> None:
    forms = [schema_of(rule) for rule in RULES]
    assert LensembleConfig.model_json_schema()["allOf"] == [f for f in forms if f is not None]
    # Rules that compare two fields or count have no exact JSON Schema form.
    assert schema_of(next(r for r in RULES if r.id == "rpc-within-round")) is None


def test_a_scope_hides_no_name_of_its_enclosing_scopes() -> None:
    for scope, names in SCOPE_NAMES.items():
        outer = ENCLOSING[scope]
        while outer is not None:
            assert not set(names) & set(SCOPE_NAMES[outer]), (scope, outer)
            outer = ENCLOSING[outer]


def test_expressions_outside_the_language_are_refused() -> None:
    with pytest.raises(NotExpressible):
        parsed("[x for x in c]")
    with pytest.raises(NotExpressible):
        parsed("1 < c.a < 3")
