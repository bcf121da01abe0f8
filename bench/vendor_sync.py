"""Time of ``python -m tools.vendor sync`` (warm download cache) and ``check``, real projects.

Runs on a scratch copy of ``third_party/`` (manifests, locks, patches) so the working tree is
untouched. The first sync fills a scratch cache from the package index (timed separately, needs
the network); then median of 5 in-process runs of each step. Also prints each tree's size.

    python bench/vendor_sync.py
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tools.vendor import check_project, find_projects, sync_project

REPO = Path(__file__).resolve().parents[1]
RUNS = 5


def seconds(step: Callable[[], object]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def main() -> None:
    # No options: --help prints what this bench measures.
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        third_party = Path(scratch) / "third_party"
        shutil.copytree(
            REPO / "third_party", third_party, ignore=shutil.ignore_patterns("src", ".cache")
        )
        print(
            f"{'project':<20} {'first sync s':>12} {'sync s':>8} {'check s':>8} "
            f"{'files':>6} {'tree MB':>8}"
        )
        for project in find_projects(third_party):
            first = seconds(lambda p=project: sync_project(p, locked=True))
            sync_s = statistics.median(
                seconds(lambda p=project: sync_project(p, locked=True)) for _ in range(RUNS)
            )
            check_s = statistics.median(
                seconds(lambda p=project: check_project(p)) for _ in range(RUNS)
            )
            files = [f for f in project.src.rglob("*") if f.is_file()]
            size_mb = sum(f.stat().st_size for f in files) / 1e6
            print(
                f"{project.name:<20} {first:>12.2f} {sync_s:>8.3f} {check_s:>8.3f} "
                f"{len(files):>6} {size_mb:>8.2f}"
            )


if __name__ == "__main__":
    main()
