"""The chart itself: lint clean, generated files in sync, and Helm's schema validation.

Helm is the real Helm v4 Go SDK through the helm-python-sdk wheel.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from lensemble.render.chart_files import undocumented, value_docs
from lensemble.render.chart_values import ChartValues
from lensemble.render.helm_values import render_helm_values
from tests.k8s.renders import CASES, REPO, config_of, values_of
from tests.support.tools import require

CHART = REPO / "charts" / "lensemble"
INVALID = sorted((Path(__file__).parent / "invalid_values").glob("*.yaml"))


def _helm() -> Any:
    require("helm")
    import helm_python

    return helm_python


def _values_yaml() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    return values


def test_chart_metadata() -> None:
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert meta["apiVersion"] == "v2"
    assert meta["name"] == "lensemble"
    major, minor, patch = (int(p) for p in meta["version"].split("."))
    assert (major, minor, patch) >= (0, 1, 0)
    assert isinstance(meta["appVersion"], str)


# ------------------------------------------------------------------------- generated files
def test_values_schema_embeds_the_config_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["config"]["$ref"] == "#/$defs/LensembleConfig"
    assert "$id" not in schema["$defs"]["LensembleConfig"]
    assert schema["additionalProperties"] is False


def test_values_yaml_has_no_default_config() -> None:
    """Helm deep-merges a default's mappings into the release's: a default config would leak
    its trust domains (deployment.trust_domains) into every other config."""
    assert _values_yaml()["config"] == {}


def test_chart_without_a_config_is_refused_before_rendering() -> None:
    helm = _helm()
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError) as raised:
        chart.render({}, name="bare")
    assert "at '/config': missing properties" in str(raised.value)


def test_every_value_is_documented() -> None:
    text = (CHART / "values.yaml").read_text(encoding="utf-8")
    assert undocumented(text) == []
    documented = {d.path for d in value_docs(text)}
    for key, value in _values_yaml().items():
        assert (key,) in documented
        if isinstance(value, dict) and key != "config":
            assert all((key, sub) in documented for sub in value)


def test_an_undocumented_value_is_found() -> None:
    text = "# -- Documented.\na: 1\nb:\n  # -- Inner.\n  c: 2\n  d: 3\n"
    assert undocumented(text) == ["b", "b.d"]


def test_values_yaml_defaults_are_the_model_defaults() -> None:
    values = {**_values_yaml(), "config": {}}
    assert ChartValues.model_validate(values) == ChartValues.model_validate({"config": {}})


# --------------------------------------------------------------------------------- helm lint
def _lint_values() -> dict[str, dict[str, Any] | None]:
    out: dict[str, dict[str, Any] | None] = {}
    out.update({name: values_of(name) for name, case in CASES.items() if case.path == "helm"})
    return out


@pytest.mark.parametrize("kube_version", ["v1.33.0", "v1.37.0"])
@pytest.mark.parametrize("name", sorted(_lint_values()))
def test_helm_lint_is_clean(name: str, kube_version: str) -> None:
    helm = _helm()
    report = helm.lint(CHART, _lint_values()[name], strict=True, kube_version=kube_version)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert (problems, report["errors"]) == ([], [])


# ------------------------------------------------------------------ Helm schema validation
def _expectation(path: Path) -> str:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# expect: ")
    return first.removeprefix("# expect: ").strip()


def test_at_least_ten_invalid_values_files() -> None:
    assert len(INVALID) >= 10


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_helm_schema_validation_rejects_invalid_values(path: Path) -> None:
    helm = _helm()
    values = yaml.safe_load(path.read_text(encoding="utf-8"))
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmValuesError) as raised:
            chart.render(values, name="invalid")
        # `helm lint` and `helm install` reject it too.
        report = helm.lint(CHART, values)
        assert report["errors"]
    assert _expectation(path) in str(raised.value)


def test_schema_errors_reach_the_user_as_config_problems() -> None:
    from lensemble.errors import ConfigError
    from lensemble.render.k8s import render_chart

    _helm()
    values = render_helm_values(config_of("helm-staging"))
    values["podSecurity"] = {"runAsUser": 0}
    values["config"]["network"]["port"] = 0
    with pytest.raises(ConfigError) as raised:
        render_chart(values, source="values-staging.yaml")
    paths = sorted(p.path for p in raised.value.problems)
    assert paths == ["config.network.port", "podSecurity.runAsUser"]
    assert all(p.source == "values-staging.yaml" for p in raised.value.problems)


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"mode": "participant", "trustDomain": "nowhere"}, "trustDomain: 'nowhere'"),
        ({"gangScheduling": {"scheduler": "kueue"}}, "gangScheduling.queue"),
    ],
)
def test_template_checks_name_the_value(knobs: dict[str, Any], message: str) -> None:
    from lensemble.errors import UsageError
    from lensemble.render.k8s import render_chart

    _helm()
    values = {**render_helm_values(config_of("helm-staging")), **knobs}
    with pytest.raises(UsageError) as raised:
        render_chart(values)
    assert message in str(raised.value)
