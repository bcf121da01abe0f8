"""Every enumerated option the schema allows runs on every transport, or the schema refuses it.

The options come from the JSON Schema (every ``enum``/``const`` leaf), so a value added to a
``Literal`` joins the sweep by itself. Options only renderers read (``deployment.*``: the chart,
overlays and Pulumi programs render each of them, tests/k8s and tests/infra) and the transport
(the sweep's axis) are left out. A value validation refuses must be refused naming its field;
every other value runs one round of ``lensemble simulate`` on each transport. The runs cover the
values column by column (run k takes each field's k-th value, wrapping), so every value runs on
every transport in as many runs as the longest list has values.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lensemble.config.load import load_config
from lensemble.config.schema_export import json_schema
from lensemble.errors import ConfigError
from tests.support.cli import run_cli

pytestmark = pytest.mark.slow

LOCAL = "config/local.yaml"
TRANSPORTS = ("in_process", "network")
AXIS = "federation.transport"
RENDER_ONLY = "deployment."
#: A small federation: 2 participants, a tiny model and data set, no local-only baseline.
TINY = (
    "federation.participant_count=2",
    "federation.quorum=2",
    "federation.inner_steps=2",
    "federation.inner_optimizer.batch_size=8",
    "model.hidden_dim=8",
    "model.latent_dim=4",
    "data.episodes=4",
    "data.episode_steps=20",
    "data.window=3",
    "evaluation.k_steps=2",
    "evaluation.local_only_baseline=false",
)


def _enumerated(node: dict[str, Any], defs: dict[str, Any], path: str) -> Iterator[Any]:
    for name, spec in node.get("properties", {}).items():
        here = f"{path}.{name}" if path else name
        ref = spec.get("$ref") or spec.get("items", {}).get("$ref")
        if ref:
            index = "" if "$ref" in spec else "[0]"
            yield from _enumerated(defs[ref.rsplit("/", 1)[-1]], defs, here + index)
        options = [s for s in (spec, *spec.get("anyOf", [])) if "enum" in s or "const" in s]
        for option in options:
            yield here, option.get("enum", [option.get("const")])


#: Values that run on one transport only, with settings of their own: masking needs the
#: in-process transport, no quantization and at least 3 participants, so the masking
#: simulation's own tests run it (issue 37).
OWN_RUNS = {("federation.aggregation", "masking")}
OPTIONS = {
    path: [v for v in values if (path, v) not in OWN_RUNS]
    for path, values in _enumerated(json_schema(), json_schema()["$defs"], "")
    if not path.startswith(RENDER_ONLY) and path != AXIS
}


def _problem(path: str, value: Any) -> ConfigError | None:
    try:
        load_config(LOCAL, [f"{path}={value}"])
    except ConfigError as exc:
        return exc
    return None


ALLOWED = {
    path: [v for v in values if _problem(path, v) is None] for path, values in OPTIONS.items()
}
REFUSED = [(path, v) for path, values in OPTIONS.items() for v in values if v not in ALLOWED[path]]
RUNS = max(len(values) for values in ALLOWED.values())


def test_the_sweep_sees_the_options_that_change_a_run() -> None:
    assert {
        "model.dtype",
        "model.target",
        "model.regularizer",
        "federation.quantization",
        "federation.aggregation",
        "network.auth",
        "observability.log_level",
    } <= set(OPTIONS)
    assert ALLOWED["model.dtype"] == ["float32", "bfloat16"]
    assert all(ALLOWED.values()), "every option needs one value that runs"


@pytest.mark.parametrize(("path", "value"), REFUSED, ids=[f"{p}={v}" for p, v in REFUSED])
def test_a_refused_option_is_refused_naming_its_field(in_repo: Path, path: str, value: Any) -> None:
    result = run_cli("simulate", LOCAL, "-r", "1", "--set", f"{path}={value}")
    assert result.code == 2, result.err
    assert path in result.err and "Traceback" not in result.err


def _ledger(folder: Path) -> list[dict[str, Any]]:
    lines = (folder / "ledger.jsonl").read_text(encoding="utf-8").splitlines()
    # A v2 ledger line wraps the round record with its chain fields (docs/run-record.md).
    return [json.loads(line)["record"] for line in lines]


@pytest.mark.parametrize("run", range(RUNS))
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_allowed_option_runs_on_every_transport(
    tmp_path: Path, in_repo: Path, transport: str, run: int
) -> None:
    chosen = {path: values[run % len(values)] for path, values in ALLOWED.items()}
    settings = [f"{AXIS}={transport}", *TINY, *(f"{p}={v}" for p, v in chosen.items())]
    out = tmp_path / "run"
    args = [arg for setting in settings for arg in ("--set", setting)]
    result = run_cli("simulate", LOCAL, "-r", "1", "-o", str(out), *args)
    assert result.code == 0, (chosen, result.err[-3000:])
    (record,) = _ledger(out)
    assert record["state"] == "closed" and len(record["contributors"]) == 2, record
    assert record["quantization"] == chosen["federation.quantization"]


def test_bfloat16_parameters_run_in_process(tmp_path: Path, in_repo: Path) -> None:
    # Issue 15, item 2: exit 3, "F32[64], the global model has BF16[64]", in process only.
    out = tmp_path / "run"
    tiny = [arg for setting in TINY for arg in ("--set", setting)]
    result = run_cli("simulate", "-r", "1", "--set", "model.dtype=bfloat16", *tiny, "-o", str(out))
    assert result.code == 0, result.err[-3000:]
    assert [r["state"] for r in _ledger(out)] == ["closed"]
