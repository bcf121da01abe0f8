"""Time and size of ``lensemble render compose`` as the participant count grows.

For each count: median wall time of rendering and writing both files (5 runs, in process),
the Compose file's size, and the time Debian's ``docker-compose config -q`` takes to validate
it (one run; skipped when docker-compose is not installed).

    python bench/compose_render.py
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from lensemble.config import load_config
from lensemble.render.compose_files import write_compose

REPO = Path(__file__).resolve().parents[1]
RUNS = 5
COUNTS = (4, 16, 64, 256)


def main() -> None:
    # No options: --help prints what this bench measures.
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    compose_tool = shutil.which("docker-compose")
    header = ("participants", "services", "render (ms)", "file (KiB)", "validate (s)")
    print(" ".join(f"{h:>13}" for h in header))
    for count in COUNTS:
        cfg = load_config(
            REPO / "config/local.yaml",
            [
                "federation.transport=network",
                f"federation.participant_count={count}",
                "federation.quorum=1",
            ],
        )
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "compose.yaml"
            samples = []
            for _ in range(RUNS):
                start = time.perf_counter()
                write_compose(cfg, out)
                samples.append(time.perf_counter() - start)
            validate = "-"
            if compose_tool:
                start = time.perf_counter()
                subprocess.run([compose_tool, "-f", str(out), "config", "-q"], check=True)
                validate = f"{time.perf_counter() - start:.2f}"
            size = out.stat().st_size / 1024
        row = (count, 2 * count + 1, f"{statistics.median(samples) * 1000:.1f}", f"{size:.1f}")
        print(" ".join(f"{v:>13}" for v in (*row, validate)))


if __name__ == "__main__":
    main()
