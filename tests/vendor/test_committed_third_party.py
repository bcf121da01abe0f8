"""The committed third_party/ records are complete and agree with each other (offline).

Upstream source is not committed, so these tests check what is: manifests, locks, patches and
UPSTREAM.md. The online test re-derives the locks from the package index.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tools.vendor import find_projects
from tools.vendor.drift import check_metadata
from tools.vendor.manifest import Project
from tools.vendor.patches import check_dep3, patch_series


@pytest.fixture(scope="module")
def projects() -> list[Project]:
    root = Path(__file__).resolve().parents[2] / "third_party"
    found = find_projects(root)
    assert [p.name for p in found] == ["stable_pretraining", "stable_worldmodel"]
    return found


def test_locks_patches_and_dep3_headers_are_consistent(projects: list[Project]) -> None:
    for project in projects:
        lock = check_metadata(project)  # raises on any inconsistency
        assert lock.package == project.manifest.upstream.package
        series = patch_series(project.patches_dir)
        assert series, f"{project.name} has no patch"
        for patch in series:
            fields = check_dep3(patch.path)
            assert fields["Forwarded"] in ("no", "not-needed") or "://" in fields["Forwarded"]


def test_upstream_md_records_the_pin_license_and_every_patch(projects: list[Project]) -> None:
    for project in projects:
        text = (project.root / "UPSTREAM.md").read_text()
        lock = project.load_lock()
        assert lock is not None
        # A moved pin or a new patch without an updated UPSTREAM.md fails here.
        for needed in (
            project.manifest.upstream.repository,
            f"pinned release | {lock.version}",
            lock.filename,
            lock.sha256,
            f"license (SPDX) | {project.manifest.license.spdx}",
            "## Modification log",
            "## Re-sync from a fresh clone",
            "## Why vendored, and when it stops being",
            "## Moving the pin",
            *(p.name for p in lock.patches),
        ):
            assert needed in text, f"{project.name}/UPSTREAM.md lacks {needed!r}"
        if lock.upstream_commit:
            assert lock.upstream_commit in text


def test_stable_worldmodel_license_exception_is_recorded(projects: list[Project]) -> None:
    swm = next(p for p in projects if p.name == "stable_worldmodel")
    exception = swm.manifest.license.exception
    assert exception is not None
    assert exception.source and exception.date.year >= 2025
    assert "LICENSE" in exception.sync_note
    assert "Sync the file once upstream publishes it" in (swm.root / "UPSTREAM.md").read_text()


def test_worldmodel_extra_holds_the_vendored_pins_and_core_does_not(repo: Path) -> None:
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    extra = project["optional-dependencies"]["worldmodel"]
    assert "lancedb>=0.30.0" in extra
    assert "pylance>=4.0.0" in extra
    core = {
        d.split(">")[0].split("=")[0].split("<")[0].strip().lower() for d in project["dependencies"]
    }
    upstream_md = (repo / "third_party/stable_worldmodel/UPSTREAM.md").read_text()
    for requirement in extra:
        name = requirement.split(">")[0].split("=")[0].strip().lower()
        assert name not in core, f"{name} would make the core install need the extra"
        notes = upstream_md + (repo / "third_party/stable_pretraining/UPSTREAM.md").read_text()
        assert requirement in notes, f"{requirement} is not recorded in an UPSTREAM.md"
