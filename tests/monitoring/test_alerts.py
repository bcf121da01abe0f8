"""The alert rules: promtool accepts them, and each fires on its scenario and only there.

``tests/monitoring/alerts.test.yaml`` is promtool's unit test of the rules; the mutation test
below proves that every alert has a scenario that fails when the alert stops firing.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from tests.support.tools import require

RULES = REPO / "runtime/lensemble/render/monitoring/alerts.yaml"
RULE_TESTS = REPO / "tests/monitoring/alerts.test.yaml"
OPERATIONS = REPO / "docs/operations.md"


def _alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def _promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    require("promtool")
    return subprocess.run(
        ["promtool", *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_accepts_the_rules() -> None:
    done = _promtool("check", "rules", RULES)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_fires_on_its_scenario() -> None:
    done = _promtool("test", "rules", RULE_TESTS)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.integration  # one promtool run per alert: about 10 s on 2 cores
@pytest.mark.parametrize("alert", [a["alert"] for a in _alerts()])
def test_an_alert_that_never_fires_fails_its_scenario(alert: str, tmp_path: Path) -> None:
    data = yaml.safe_load(RULES.read_text())
    for group in data["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                rule["expr"] = "vector(1) == 0"
    rules = tmp_path / "alerts.yaml"
    rules.write_text(yaml.safe_dump(data))
    tests = yaml.safe_load(RULE_TESTS.read_text())
    tests["rule_files"] = [str(rules)]
    test_file = tmp_path / "alerts.test.yaml"
    test_file.write_text(yaml.safe_dump(tests))
    done = _promtool("test", "rules", test_file)
    assert done.returncode != 0, f"no scenario notices that {alert} stopped firing"
    assert alert in done.stdout + done.stderr


def test_every_alert_has_a_summary_and_a_runbook_section() -> None:
    text = OPERATIONS.read_text()
    headings = {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", text, flags=re.M)
    }
    for rule in _alerts():
        annotations = rule["annotations"]
        assert annotations["summary"].strip()
        anchor = annotations["runbook_url"].split("#", 1)[1]
        assert annotations["runbook_url"] == f"docs/operations.md#{anchor}"
        assert anchor in headings, f"docs/operations.md has no runbook section for {rule['alert']}"
