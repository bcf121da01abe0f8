"""Every numeric field's range is enforced by the schema, and is the range its docs state.

The boundary values come from the JSON Schema itself (``minimum``, ``maximum`` and the
exclusive bounds, also of tuple items): each value just outside a bound, each excluded bound,
and NaN and infinities for floats, goes through ``lensemble config validate --set`` and must give
exit 2 naming the field. A range stated in a description must be the one the schema enforces.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

import pytest

from lensemble.config.reference import range_text
from lensemble.config.schema_export import json_schema
from tests.support.cli import run_cli

LOCAL = "config/local.yaml"

#: A range in a description: "in [0, 1)", "in (0, 1)", "an integer in [0, 2^63)".
DOCUMENTED = re.compile(r"\bin ([\[(])\s*([-+0-9.e^]+)\s*,\s*([-+0-9.e^]+)\s*([\])])")


def _number(text: str) -> float:
    base, _, power = text.partition("^")
    return float(base) ** float(power) if power else float(base)


def _leaves(
    node: dict[str, Any], defs: dict[str, Any], path: str
) -> Iterator[tuple[str, int | None, dict[str, Any], dict[str, Any]]]:
    """(field path, tuple index or None, numeric schema, the field's own schema)."""
    for name, spec in node.get("properties", {}).items():
        here = f"{path}.{name}" if path else name
        ref = spec.get("$ref") or spec.get("items", {}).get("$ref")
        if ref:
            index = "" if "$ref" in spec else "[0]"  # a list of objects: its first entry
            yield from _leaves(defs[ref.rsplit("/", 1)[-1]], defs, here + index)
        elif spec.get("type") in ("number", "integer"):
            yield here, None, spec, spec
        for i, item in enumerate(spec.get("prefixItems", [])):
            if item.get("type") in ("number", "integer"):
                yield here, i, item, spec


LEAVES = list(_leaves(json_schema(), json_schema()["$defs"], ""))


def _outside(spec: dict[str, Any]) -> list[Any]:
    """Values just outside each bound of ``spec`` (the excluded bounds themselves included)."""
    integer = spec["type"] == "integer"
    values: list[Any] = []
    if "minimum" in spec:
        low = spec["minimum"]
        values.append(low - 1 if integer else math.nextafter(low, -math.inf))
    if "maximum" in spec:
        high = spec["maximum"]
        values.append(high + 1 if integer else math.nextafter(high, math.inf))
    values += [spec[key] for key in ("exclusiveMinimum", "exclusiveMaximum") if key in spec]
    if not integer:
        values += ["nan", "inf", "-inf"]
    return values


def _sweeps() -> list[dict[str, str]]:
    """Batches of ``--set`` values, field path -> setting: every out-of-range value of every
    field is in exactly one batch, and a batch sets each field at most once (validation
    reports every field's problem together, so one run checks a whole batch)."""
    values: dict[str, list[list[Any]]] = {}
    defaults: dict[str, list[Any]] = {}
    for path, index, spec, field in LEAVES:
        if index is None:
            values[path] = [[v] for v in _outside(spec)]
        else:
            defaults[path] = list(field["default"])
            for k, value in enumerate(_outside(spec)):
                per_item = values.setdefault(path, [])
                while len(per_item) <= k:
                    per_item.append(list(defaults[path]))
                per_item[k][index] = value
    batches: list[dict[str, str]] = []
    for path, settings in values.items():
        for k, items in enumerate(settings):
            while len(batches) <= k:
                batches.append({})
            text = str(items[0]) if path not in defaults else f"[{', '.join(map(str, items))}]"
            batches[k][path] = f"{path}={text}"
    return batches


SWEEPS = _sweeps()


def test_every_numeric_field_is_bounded_and_the_sweep_covers_tuples() -> None:
    paths = {path for path, *_ in LEAVES}
    assert {"federation.inner_optimizer.betas", "run.root_seed", "network.port"} <= paths
    unbounded = [path for path, _, spec, _ in LEAVES if not range_text(spec)]
    assert unbounded == [], f"give these fields a range: {unbounded}"


def test_every_out_of_range_value_is_in_a_sweep() -> None:
    swept = sum(len(batch) for batch in SWEEPS)
    scalar = sum(len(_outside(spec)) for _, index, spec, _ in LEAVES if index is None)
    assert swept >= scalar > 2 * len({path for path, *_ in LEAVES})


@pytest.mark.parametrize("batch", SWEEPS, ids=lambda b: f"{len(b)}-fields")
def test_out_of_range_values_exit_2_naming_each_field(batch: dict[str, str]) -> None:
    overrides = [arg for setting in batch.values() for arg in ("--set", setting)]
    result = run_cli("config", "validate", LOCAL, *overrides)
    assert result.code == 2, (batch, result.out)
    assert "Traceback" not in result.err
    # Each problem line is "error: --set SETTING: [PATH[i]: ]MESSAGE".
    lines = result.err.splitlines()
    unnamed = [s for s in batch.values() if not any(f"--set {s}: " in line for line in lines)]
    assert unnamed == [], result.err


@pytest.mark.parametrize(
    ("path", "index", "spec", "description"),
    [
        pytest.param(path, index, spec, field.get("description", ""), id=f"{path}[{index}]")
        for path, index, spec, field in LEAVES
        if DOCUMENTED.search(field.get("description", ""))
    ],
)
def test_a_documented_range_is_the_enforced_range(
    path: str, index: int | None, spec: dict[str, Any], description: str
) -> None:
    match = DOCUMENTED.search(description)
    assert match is not None
    opening, low, high, closing = match.groups()
    low_key = "minimum" if opening == "[" else "exclusiveMinimum"
    high_key = "maximum" if closing == "]" else "exclusiveMaximum"
    assert spec.get(low_key) == _number(low), (path, index, description, spec)
    assert spec.get(high_key) == _number(high), (path, index, description, spec)


def test_adam_betas_outside_0_1_are_refused_before_training() -> None:
    # Issue 15, item 3: this validated, and simulate died in torch's ValueError.
    betas = "federation.inner_optimizer.betas=[1.5,-2]"
    for command in (("config", "validate", LOCAL), ("simulate", LOCAL, "-r", "1")):
        result = run_cli(*command, "--set", betas)
        assert result.code == 2, result.err
        assert "federation.inner_optimizer.betas[0]" in result.err
        assert "federation.inner_optimizer.betas[1]" in result.err
        assert "Traceback" not in result.err
