"""The WAN benchmark (``bench/wan.py``) on its smallest profile: shaped links in the path.

Two participants, each in its own network namespace behind a link shaped to 100 Mbit/s with
80 ms of round trip and 0.1% loss, take part in two rounds with the coordinator in a third
namespace. The run must commit and report every participant's goodput, and the shaping must
be in the path: no transfer can have run faster than its link's rate allows (a margin covers
the token bucket's burst), and no round can have taken less than one round trip.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.network import REPO
from tests.support.tools import require

pytestmark = [pytest.mark.netns, pytest.mark.slow]
#: How far above its shaped rate a measured transfer may come (the token bucket's burst).
RATE_MARGIN = 1.1


def test_smallest_profile_commits_and_reports_goodput_within_the_shaped_rate(
    tmp_path: Path,
) -> None:
    require("netns")
    for tool in ("tc", "iptables"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not on PATH")
    out = tmp_path / "wan.jsonl"
    argv = [sys.executable, str(REPO / "bench" / "wan.py"), "--profiles", "100M-80ms"]
    argv += ["--params", "1M", "--participants", "2", "--rounds", "2", "--out", str(out)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["participant"] for r in rows) == ["p0", "p1"]
    for row in rows:
        assert row["delay_by"] in ("netem", "relay")
        for way in ("up", "down"):
            goodput, rate = row[f"{way}_goodput_mbit"], row[f"{way}_mbit"]
            assert math.isfinite(goodput) and goodput > 0, row
            assert goodput <= rate * RATE_MARGIN, f"{way} faster than its shaped link: {row}"
            assert 0 < row[f"raw_{way}_fraction"] <= RATE_MARGIN, row
        assert row["up_verdict_fraction"] <= row["up_fraction"], row
        assert row["round_wall_s"] >= 0.080, f"a round took less than one round trip: {row}"
    # Every namespace the bench made is gone.
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    assert "wanb-" not in left.stdout
