"""`python -m tools.vendor sync` and `check` end to end against fixture distributions (offline).

Each test builds its own distributions and serves them from a loopback index, then drives the
real CLI and checks exit codes, the materialised tree, the lock and the messages people read.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from tests.support.cli import run_tool
from tests.vendor.fixtures import (
    DEMO_V1,
    PATCH_LOUD,
    PATCH_TRIPLE,
    LoopbackIndex,
    Workspace,
    dep3,
    sdist_bytes,
    sdist_name,
    wheel_bytes,
    write_project,
)


def test_update_pins_release_applies_patches_and_check_is_clean(pinned: Workspace) -> None:
    lock = pinned.lock
    published = hashlib.sha256(sdist_bytes("demo-pkg", "1.0", DEMO_V1)).hexdigest()
    assert (lock["version"], lock["sha256"]) == ("1.0", published)
    assert [p["name"] for p in lock["patches"]] == [  # type: ignore[index, union-attr]
        "0001-greet-loudly.patch",
        "0002-add-triple.patch",
    ]
    # Unpatched files are byte-identical to upstream; patched ones carry the change.
    assert (pinned.src / "LICENSE").read_bytes() == DEMO_V1["LICENSE"]
    assert (pinned.src / "demo_pkg/__init__.py").read_text().startswith('GREETING = "HELLO"')
    assert "def triple" in (pinned.src / "demo_pkg/util.py").read_text()
    assert lock["pristine_digest"] != lock["tree_digest"]

    result = pinned.vendor("check")
    assert result.code == 0, result.err
    assert "clean demo_pkg: demo-pkg 1.0 + 2 patch(es)" in result.out
    assert "license MIT (LICENSE)" in result.out


def test_resync_from_cache_needs_no_index_and_keeps_lock(pinned: Workspace, tmp_path: Path) -> None:
    lock_before = (pinned.project / "vendor.lock.json").read_bytes()
    cache = tmp_path / "offline-cache"
    cache.mkdir()
    shutil.copy(pinned.root / "third_party/.cache" / sdist_name("demo-pkg", "1.0"), cache)
    pinned.index.files.clear()  # the index no longer has anything
    shutil.rmtree(pinned.src)

    result = pinned.vendor("sync", "demo_pkg", "--cache", str(cache), "--locked")
    assert result.code == 0, result.err
    assert "lock unchanged" in result.out
    assert (pinned.project / "vendor.lock.json").read_bytes() == lock_before
    assert pinned.vendor("check").code == 0


def test_cached_distribution_with_wrong_sha256_fails_closed(
    pinned: Workspace, tmp_path: Path
) -> None:
    cache = tmp_path / "poisoned"
    cache.mkdir()
    poisoned = cache / sdist_name("demo-pkg", "1.0")
    poisoned.write_bytes(sdist_bytes("demo-pkg", "1.0", {**DEMO_V1, "demo_pkg/util.py": b"evil\n"}))
    before = (pinned.src / "demo_pkg/util.py").read_bytes()

    result = pinned.vendor("sync", "--cache", str(cache))
    assert result.code == 3
    assert f"{poisoned} has SHA-256" in result.err
    assert pinned.lock["sha256"] in result.err  # names the pinned digest too
    assert "Traceback" not in result.err
    assert (pinned.src / "demo_pkg/util.py").read_bytes() == before


def test_download_with_wrong_sha256_is_discarded(pinned: Workspace) -> None:
    filename = sdist_name("demo-pkg", "1.0")
    shutil.rmtree(pinned.root / "third_party/.cache")
    pinned.index.tampered[filename] = b"not the release"

    result = pinned.vendor("sync")
    assert result.code == 3
    assert "served a file with SHA-256" in result.err
    assert not (pinned.root / "third_party/.cache" / filename).exists()


def test_tampered_tree_names_the_first_differing_files(pinned: Workspace) -> None:
    (pinned.src / "demo_pkg/util.py").write_text("def double(x):\n    return x + x\n")
    (pinned.src / "demo_pkg/backdoor.py").write_text("import os\n")
    (pinned.src / "LICENSE").unlink()
    (pinned.src / "demo_pkg/__pycache__").mkdir()
    (pinned.src / "demo_pkg/__pycache__/util.cpython-311.pyc").write_bytes(b"\0")  # ignored

    result = pinned.vendor("check", "demo-pkg")
    assert result.code == 3
    first_line = result.err.splitlines()[0]
    assert "src differs from demo-pkg 1.0 plus its patches" in first_line
    assert "LICENSE (removed)" in first_line
    assert "demo_pkg/backdoor.py (added)" in first_line
    assert "demo_pkg/util.py (modified)" in first_line
    assert "pycache" not in first_line
    assert "python -m tools.vendor sync demo_pkg" in result.err

    assert pinned.vendor("sync").code == 0  # restores pristine + patches
    assert pinned.vendor("check").code == 0


def test_check_without_a_synced_tree_says_to_sync(pinned: Workspace) -> None:
    shutil.rmtree(pinned.src)
    result = pinned.vendor("check")
    assert result.code == 2
    assert "src is missing" in result.err
    assert "python -m tools.vendor sync demo_pkg" in result.err


def test_update_reports_every_patch_that_no_longer_applies(pinned: Workspace) -> None:
    lock_before = (pinned.project / "vendor.lock.json").read_bytes()
    tree_before = (pinned.src / "demo_pkg/__init__.py").read_bytes()

    result = pinned.vendor("sync", "--update", "demo-pkg==2.0")
    assert result.code == 2
    message = result.err.splitlines()[0]
    assert "demo-pkg 2.0: 1 of 2 patches no longer apply: 0001-greet-loudly.patch" in message
    assert "0002-add-triple.patch" not in message  # that one still applies
    assert "the pin stays at 1.0" in message
    # Nothing moved: lock and tree are as before, and still consistent.
    assert (pinned.project / "vendor.lock.json").read_bytes() == lock_before
    assert (pinned.src / "demo_pkg/__init__.py").read_bytes() == tree_before
    assert pinned.vendor("check").code == 0


def test_update_moves_the_pin_once_patches_are_refreshed(pinned: Workspace) -> None:
    refreshed = PATCH_LOUD.replace('-GREETING = "hello"', '-GREETING = "hi there"')
    (pinned.project / "patches/0001-greet-loudly.patch").write_text(refreshed)

    result = pinned.vendor("sync", "--update", "demo-pkg==2.0")
    assert result.code == 0, result.err
    assert "demo-pkg 2.0 (moved from 1.0)" in result.out
    assert "lock updated" in result.out
    assert pinned.lock["version"] == "2.0"
    assert (pinned.src / "demo_pkg/__init__.py").read_text().splitlines()[2] == "GENERATION = 2"
    assert pinned.vendor("check").code == 0


def test_patch_that_does_not_apply_is_named(demo: Workspace) -> None:
    stale = PATCH_TRIPLE.replace("return 2 * x", "return 2.0 * x")
    (demo.project / "patches/0002-add-triple.patch").write_text(stale)

    result = demo.vendor("sync", "--update", "demo-pkg==1.0")
    assert result.code == 2
    assert "0002-add-triple.patch" in result.err
    assert "0001-greet-loudly.patch" not in result.err.splitlines()[0]
    assert not demo.src.exists()
    assert not (demo.project / "vendor.lock.json").exists()


def test_patch_missing_a_dep3_field_is_refused(pinned: Workspace) -> None:
    no_forwarded = PATCH_TRIPLE.replace(dep3("Add triple()"), dep3("Add triple()", Forwarded=None))
    (pinned.project / "patches/0002-add-triple.patch").write_text(no_forwarded)

    for args in (["sync"], ["check"]):
        result = pinned.vendor(*args)
        assert result.code == 2, args
        assert "patch 0002-add-triple.patch lacks the DEP-3 field Forwarded" in result.err


def test_patch_with_a_bad_last_update_is_refused(pinned: Workspace) -> None:
    text = PATCH_TRIPLE.replace("Last-Update: 2026-01-31", "Last-Update: last week")
    (pinned.project / "patches/0002-add-triple.patch").write_text(text)
    result = pinned.vendor("check")
    assert result.code == 2
    assert "not a YYYY-MM-DD date" in result.err


def test_misnamed_patch_is_refused(pinned: Workspace) -> None:
    (pinned.project / "patches/fix-things.diff").write_text(PATCH_TRIPLE)
    result = pinned.vendor("check")
    assert result.code == 2
    assert "fix-things.diff is not named NNNN-short-name.patch" in result.err


def test_new_patch_needs_a_lock_refresh(pinned: Workspace) -> None:
    shout = dep3("Shout") + PATCH_LOUD.split("---\n", 1)[1].replace('"HELLO"', '"HELLO!"').replace(
        '-GREETING = "hello"', '-GREETING = "HELLO"'
    )
    (pinned.project / "patches/0003-shout.patch").write_text(shout)

    check = pinned.vendor("check")
    assert check.code == 3
    assert "patch series changed since the lock was written (0003-shout.patch (new))" in check.err
    locked = pinned.vendor("sync", "--locked")
    assert locked.code == 3
    assert "vendor.lock.json is out of date" in locked.err

    result = pinned.vendor("sync")
    assert result.code == 0, result.err
    assert "3 patch(es) applied" in result.out
    assert "lock updated" in result.out
    assert '"HELLO!"' in (pinned.src / "demo_pkg/__init__.py").read_text()
    assert pinned.vendor("check").code == 0


def test_missing_license_without_exception_fails_closed(
    tmp_path: Path, index: LoopbackIndex
) -> None:
    files = {k: v for k, v in DEMO_V1.items() if k != "LICENSE"}
    index.add("bare-pkg", sdist_name("bare-pkg", "1.0"), sdist_bytes("bare-pkg", "1.0", files))
    project = write_project(tmp_path, "bare_pkg", package="bare-pkg", index_url=index.simple)

    result = run_tool("vendor", "sync", "--update", "bare-pkg==1.0", "--root", str(tmp_path))
    assert result.code == 3
    assert "bare_pkg/src has no 'LICENSE'" in result.err
    assert "records no license exception" in result.err
    assert not (project / "src").exists()
    assert not (project / "vendor.lock.json").exists()


def test_missing_license_with_recorded_exception_passes(
    tmp_path: Path, index: LoopbackIndex
) -> None:
    files = {k: v for k, v in DEMO_V1.items() if k != "LICENSE"}
    index.add("bare-pkg", sdist_name("bare-pkg", "1.0"), sdist_bytes("bare-pkg", "1.0", files))
    write_project(tmp_path, "bare_pkg", package="bare-pkg", index_url=index.simple, exception=True)

    assert (
        run_tool("vendor", "sync", "--update", "bare-pkg==1.0", "--root", str(tmp_path)).code == 0
    )
    result = run_tool("vendor", "check", "--root", str(tmp_path))
    assert result.code == 0, result.err
    assert "license MIT (no file; recorded exception)" in result.out
    assert "note:" not in result.out


def test_exception_is_flagged_once_upstream_ships_the_license(
    tmp_path: Path, index: LoopbackIndex
) -> None:
    index.add("demo-pkg", sdist_name("demo-pkg", "1.0"), sdist_bytes("demo-pkg", "1.0", DEMO_V1))
    write_project(
        tmp_path,
        "demo_pkg",
        package="demo-pkg",
        index_url=index.simple,
        license_file="COPYING",
        exception=True,
    )
    result = run_tool("vendor", "sync", "--update", "demo-pkg==1.0", "--root", str(tmp_path))
    assert result.code == 0, result.err
    assert "note: upstream now ships LICENSE: set license.file and drop the exception" in result.out


def test_upstream_relicensing_is_caught(tmp_path: Path, index: LoopbackIndex) -> None:
    files = {**DEMO_V1, "PKG-INFO": DEMO_V1["PKG-INFO"].replace(b"MIT", b"GPL-3.0-only")}
    index.add("demo-pkg", sdist_name("demo-pkg", "1.0"), sdist_bytes("demo-pkg", "1.0", files))
    write_project(tmp_path, "demo_pkg", package="demo-pkg", index_url=index.simple)
    result = run_tool("vendor", "sync", "--update", "demo-pkg==1.0", "--root", str(tmp_path))
    assert result.code == 3
    assert "declares license 'GPL-3.0-only'" in result.err


def test_wheel_with_license_glob_and_upstream_commit(tmp_path: Path, index: LoopbackIndex) -> None:
    commit = "3b7706dc83c2f4c16d2bed4b64e6f29273c197c8"
    wheel = wheel_bytes(
        {
            "wheel_pkg/__init__.py": b"VALUE = 1\n",
            "wheel_pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.4\nName: wheel-pkg\n"
            b"Version: 1.0\nLicense: MIT\n",
            "wheel_pkg-1.0.dist-info/licenses/LICENSE": b"MIT\n",
            "wheel_pkg-1.0.dist-info/scm_version.json": f'{{"node": "g{commit}"}}'.encode(),
        }
    )
    index.add("wheel-pkg", "wheel_pkg-1.0-py3-none-any.whl", wheel)
    index.add("wheel-pkg", "wheel_pkg-1.0-cp311-cp311-linux_x86_64.whl", b"binary, never chosen")
    project = write_project(
        tmp_path,
        "wheel_pkg",
        package="wheel-pkg",
        index_url=index.simple,
        distribution="wheel",
        license_file="*.dist-info/licenses/LICENSE",
    )
    result = run_tool("vendor", "sync", "--update", "wheel-pkg==1.0", "--root", str(tmp_path))
    assert result.code == 0, result.err
    assert (project / "src/wheel_pkg/__init__.py").read_bytes() == b"VALUE = 1\n"
    check = run_tool("vendor", "check", "wheel-pkg", "--root", str(tmp_path))
    assert "license MIT (wheel_pkg-1.0.dist-info/licenses/LICENSE)" in check.out
    assert f'"upstream_commit": "{commit}"' in (project / "vendor.lock.json").read_text()


def test_archive_with_unsafe_path_is_refused(tmp_path: Path, index: LoopbackIndex) -> None:
    evil = sdist_bytes("demo-pkg", "1.0", DEMO_V1, extra_member="demo_pkg-1.0/../../escape.txt")
    index.add("demo-pkg", sdist_name("demo-pkg", "1.0"), evil)
    write_project(tmp_path, "demo_pkg", package="demo-pkg", index_url=index.simple)
    result = run_tool("vendor", "sync", "--update", "demo-pkg==1.0", "--root", str(tmp_path))
    assert result.code == 2
    assert "unsafe path" in result.err
    assert not (tmp_path.parent / "escape.txt").exists()


def test_unknown_version_and_bad_flags_are_one_line_errors(demo: Workspace) -> None:
    unknown = demo.vendor("sync", "--update", "demo-pkg==9.9")
    assert unknown.code == 2
    assert "demo-pkg==9.9 has no sdist" in unknown.err
    bad_flag = demo.vendor("sync", "--update", "demo-pkg")
    assert bad_flag.code == 2
    assert "is not NAME==VERSION" in bad_flag.err
    unknown_project = demo.vendor("check", "nonesuch")
    assert unknown_project.code == 2
    assert "no vendored project 'nonesuch'" in unknown_project.err
    never_pinned = demo.vendor("sync")
    assert never_pinned.code == 2
    assert "--update demo-pkg==VERSION" in never_pinned.err
    for result in (unknown, bad_flag, unknown_project, never_pinned):
        assert "Traceback" not in result.err


def test_unreachable_index_is_a_missing_dependency(pinned: Workspace) -> None:
    shutil.rmtree(pinned.root / "third_party/.cache")
    lock_path = pinned.project / "vendor.lock.json"
    lock_path.write_text(lock_path.read_text().replace(pinned.index.base, "http://127.0.0.1:9"))
    result = pinned.vendor("sync")
    assert result.code == 4
    assert "cannot download http://127.0.0.1:9/" in result.err
    assert "put demo_pkg-1.0.tar.gz into" in result.err
