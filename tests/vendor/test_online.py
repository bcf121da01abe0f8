"""The real pins, from the real package index: sync from scratch reproduces the committed locks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.cli import run_tool
from tests.support.tools import require
from tools.vendor import find_projects
from tools.vendor.fetch import resolve_release


@pytest.mark.online
def test_real_pins_sync_from_the_index_and_match_their_locks(repo: Path, tmp_path: Path) -> None:
    require("pypi")
    # A fresh clone: manifests, locks and patches only; no src/ and no download cache.
    shutil.copytree(
        repo / "third_party",
        tmp_path / "third_party",
        ignore=shutil.ignore_patterns("src", ".cache"),
    )
    locks_before = {
        p: p.read_bytes() for p in (tmp_path / "third_party").glob("*/vendor.lock.json")
    }
    assert len(locks_before) == 2

    result = run_tool("vendor", "sync", "--locked", "--root", str(tmp_path))
    assert result.code == 0, result.err
    assert result.out.count("lock unchanged") == 2
    assert {p: p.read_bytes() for p in locks_before} == locks_before

    check = run_tool("vendor", "check", "--root", str(tmp_path))
    assert check.code == 0, check.err
    assert check.out.count("clean ") == 2

    # The index still publishes each pinned file at the locked URL with the locked SHA-256.
    for project in find_projects(tmp_path / "third_party"):
        lock = project.load_lock()
        assert lock is not None
        upstream = project.manifest.upstream
        release = resolve_release(
            upstream.index_url, upstream.package, lock.version, upstream.distribution
        )
        assert (release.filename, release.url, release.sha256) == (
            lock.filename,
            lock.url,
            lock.sha256,
        )
