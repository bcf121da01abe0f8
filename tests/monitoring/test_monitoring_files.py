"""The dashboard and the rules ask only for metrics the processes export; Prometheus accepts
the Compose profile's configuration."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

from lensemble.config import load_config
from lensemble.network.shared.metrics import Metrics
from lensemble.render.compose_files import prometheus_config_text
from lensemble.render.prometheus import ALERTS_NAME, alert_rules_text
from tests.conftest import REPO
from tests.support.tools import require

DASHBOARD = REPO / "charts/lensemble/files/grafana-dashboard.json"
_METRIC = re.compile(r"\blensemble_[a-z_]+\b")


def _exported() -> set[str]:
    """Every sample name a process exports (``_total``, ``_bucket``, ... included)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    return {
        family.name + suffix
        for family in Metrics().registry.collect()
        for suffix in suffixes.get(family.type, ("",))
    }


def _dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def test_every_dashboard_query_names_exported_metrics() -> None:
    exported = _exported()
    exprs = _dashboard_exprs()
    assert len(exprs) >= 15
    unknown = {m for e in exprs for m in _METRIC.findall(e)} - exported
    # The enum's label of the same name is a label, not a metric.
    assert unknown <= {"lensemble_round_state"} and "lensemble_round_state" in exported, unknown


def test_every_alert_names_exported_metrics() -> None:
    exprs = [
        rule["expr"]
        for group in yaml.safe_load(alert_rules_text())["groups"]
        for rule in group["rules"]
    ]
    unknown = {m for e in exprs for m in _METRIC.findall(e)} - _exported()
    assert not unknown


def test_promtool_accepts_the_compose_prometheus_config(tmp_path: Path) -> None:
    require("promtool")
    config = load_config(REPO / "config/local.yaml", ["federation.transport=network"])
    text = prometheus_config_text(config)
    (tmp_path / ALERTS_NAME).write_text(alert_rules_text())
    local = text.replace(f"/etc/prometheus/{ALERTS_NAME}", str(tmp_path / ALERTS_NAME))
    (tmp_path / "prometheus.yml").write_text(local)
    done = subprocess.run(
        ["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = yaml.safe_load(text)["scrape_configs"]
    assert len(jobs) == 1 + len(config.participant_ids)
