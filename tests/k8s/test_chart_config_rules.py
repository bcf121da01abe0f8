"""The chart refuses every config a pod would refuse or silently mis-serve.

A pod runs the mounted config through ``LensembleConfig`` (exit 2 at start: a crash loop) and
relies on the container contract (a loopback ``listen_host`` never passes a probe).

The config's cross-field rules are one registry (``lensemble.config.rules``) from which the
chart's ``templates/_rules.tpl`` is generated. For every rule, the config that breaks it
(``tests/config/rule_examples.py``) must make ``LensembleConfig`` and the chart's template check
(reached with the values schema bypassed) name the same field with the same message; where the
rule has a JSON Schema form, the values schema must refuse it too, naming the field. The
container contract is the values schema's alone.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from lensemble.config.load import validate_mapping
from lensemble.config.rules import RULES, schema_of
from lensemble.errors import ConfigError, UsageError
from tests.config.rule_examples import BREAKING, edited_values
from tests.k8s.renders import REPO, values_of
from tests.support.tools import require

CHART = REPO / "charts" / "lensemble"
RULE_IDS = [rule.id for rule in RULES]

#: The container contract: (case id, rendered values, edits of ``config``, the field named).
CONTRACT: list[tuple[str, str, tuple[tuple[str, Any], ...], str]] = [
    # Issue 15, item 5: rendered without error, then never Ready.
    (
        "loopback-listen-host",
        "helm-staging",
        (("network.listen_host", "127.0.0.1"),),
        "network.listen_host",
    ),
    (
        "output-outside-the-volume",
        "helm-staging",
        (("run.output_dir", "runs/x"),),
        "run.output_dir",
    ),
    (
        "in-process-in-a-pod",
        "helm-staging",
        (("federation.transport", "in_process"),),
        "federation.transport",
    ),
    (
        "tls-file-not-mounted",
        "helm-staging",
        (("network.tls.ca_file", "/ca.crt"),),
        "network.tls.ca_file",
    ),
]


def _helm() -> Any:
    require("helm")
    import helm_python

    return helm_python


@pytest.fixture(scope="module")
def schemaless_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart without ``values.schema.json``: values reach the template checks unchecked."""
    chart = tmp_path_factory.mktemp("chart") / "lensemble"
    shutil.copytree(CHART, chart)
    (chart / "values.schema.json").unlink()
    return chart


def _plain_numbers(text: str) -> str:
    """Python prints 30.0 where Go prints 30: the same number."""
    return re.sub(r"(?<![\d.])(-?\d+)\.0(?![\d])", r"\1", text)


def _names(message: str, field: str) -> bool:
    parent, _, key = field.rpartition(".")
    # An unknown key is named by its parent and the key: "env_params: ... 'gravity' not allowed".
    return field in message or (f"{parent}:" in message and f"'{key}'" in message)


def test_every_rule_has_a_breaking_example() -> None:
    assert sorted(set(RULE_IDS) - set(BREAKING)) == [], "add a breaking example for these rules"


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
def test_the_chart_names_the_field_and_fix_the_config_names(
    rule: Any, schemaless_chart: Path
) -> None:
    from lensemble.render.k8s import render_chart

    helm = _helm()
    example = BREAKING[rule.id]
    values = edited_values(example.case, example.edits)
    with pytest.raises(ConfigError) as refused:
        validate_mapping(values["config"])
    first = refused.value.problems[0]
    assert first.path == example.field
    with pytest.raises(UsageError) as failed:
        render_chart(values, chart=schemaless_chart, source="values.yaml")
    expected = f"values.yaml: config.{first.path}: {first.message}"
    assert _plain_numbers(str(failed.value)) == _plain_numbers(expected)
    if schema_of(rule) is not None:
        with pytest.raises(ConfigError) as schema:
            render_chart(values, source="values.yaml")
        assert _names(str(schema.value), example.field), str(schema.value)
        assert helm.lint(CHART, values)["errors"]


@pytest.mark.parametrize(
    ("case", "edits", "field"), [pytest.param(*c[1:], id=c[0]) for c in CONTRACT]
)
def test_the_values_schema_holds_the_container_contract(
    case: str, edits: tuple[tuple[str, Any], ...], field: str
) -> None:
    from lensemble.render.k8s import render_chart

    helm = _helm()
    values = edited_values(case, edits)
    with pytest.raises(ConfigError) as raised:
        render_chart(values, source="values.yaml")
    assert _names(str(raised.value), field), str(raised.value)
    assert helm.lint(CHART, values)["errors"]


def test_the_rendered_values_pass_before_each_edit(schemaless_chart: Path) -> None:
    from lensemble.render.k8s import render_chart

    _helm()
    cases = {example.case for example in BREAKING.values()} | {c[1] for c in CONTRACT}
    for case in sorted(cases):
        assert render_chart(values_of(case))
        assert render_chart(values_of(case), chart=schemaless_chart)
