"""``sync``: materialise a pinned release plus its patch series, and keep the lock true.

A sync never leaves a half-made tree: it stages the release in the git-ignored cache folder,
verifies, unpacks, applies every patch and runs the license guard there, and only then swaps
the staged tree in for ``src/`` and rewrites the lock when its record changed. Moving a pin
(``update``) fails with the list of patches that no longer apply and leaves pin and tree as
they were.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from tools.vendor.digest import diff_trees, file_digests, tree_digest
from tools.vendor.drift import describe_differences, series_changes
from tools.vendor.errors import NotSynced, PatchFailed, TreeDrift, VendorInputError
from tools.vendor.fetch import Release, fetch_distribution, resolve_release
from tools.vendor.license import LicenseStatus, check_license
from tools.vendor.manifest import CACHE_DIR, LOCK_FILE, Lock, LockedPatch, Project
from tools.vendor.patches import Patch, apply_patch, check_dep3, patch_series
from tools.vendor.unpack import unpack


@dataclass(frozen=True)
class SyncReport:
    """What one sync did.

    Attributes:
        project: Directory name under ``third_party/``.
        package: Distribution name on the index.
        version: The release now materialised.
        previous_version: The release pinned before (differs from ``version`` after a move).
        filename: Distribution file name.
        sha256: Its SHA-256.
        upstream_commit: Upstream commit of the release, when recorded in the distribution.
        patches: Number of patches applied.
        files: Number of files in the tree.
        tree_digest: Digest of the patched tree.
        lock_changed: Whether ``vendor.lock.json`` was rewritten.
        license: Outcome of the license guard.
    """

    project: str
    package: str
    version: str
    previous_version: str | None
    filename: str
    sha256: str
    upstream_commit: str | None
    patches: int
    files: int
    tree_digest: str
    lock_changed: bool
    license: LicenseStatus


def _upstream_commit(tree: Path) -> str | None:
    """The VCS commit that setuptools-scm recorded in the distribution, if it did."""
    for path in sorted(tree.glob("*.dist-info/scm_version.json")):
        try:
            node = str(json.loads(path.read_text(encoding="utf-8")).get("node", ""))
        except ValueError:
            continue
        node = node.removeprefix("g")
        if len(node) == 40 and all(c in "0123456789abcdef" for c in node):
            return node
    archival = tree / ".git_archival.txt"
    if archival.is_file():
        for line in archival.read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "node" and len(value.strip()) == 40:
                return value.strip()
    return None


def _lock_differences(old: Lock, new: Lock) -> list[str]:
    changes = series_changes(old.patches, new.patches)
    if changes:
        return [f"patch series: {', '.join(changes)}"]
    diff = diff_trees(old.files, new.files)
    if not diff.clean:
        total = len(diff.modified) + len(diff.added) + len(diff.removed)
        return [f"files: {describe_differences(diff.first(5), total)}"]
    old_fields, new_fields = old.model_dump(), new.model_dump()
    return [
        k for k in new_fields if k not in ("files", "patches") and old_fields[k] != new_fields[k]
    ]


def _target_release(project: Project, lock: Lock | None, update: str | None) -> tuple[str, Release]:
    upstream = project.manifest.upstream
    if update is not None:
        release = resolve_release(
            upstream.index_url, upstream.package, update, upstream.distribution
        )
        return update, release
    if lock is None:
        raise NotSynced(
            f"{project.label} has no {LOCK_FILE} yet.",
            remediation=f"pin a release: `python -m tools.vendor sync {project.name} "
            f"--update {upstream.package}==VERSION`.",
        )
    if (lock.package, lock.distribution) != (upstream.package, upstream.distribution):
        raise VendorInputError(
            f"{project.label}: vendor.toml asks for the {upstream.distribution} of "
            f"{upstream.package} but the lock pins the {lock.distribution} of {lock.package}.",
            remediation=f"re-pin with --update {upstream.package}==VERSION.",
        )
    return lock.version, Release(lock.filename, lock.url, lock.sha256)


def _patch_failure(
    project: Project,
    version: str,
    lock: Lock | None,
    *,
    moving: bool,
    failures: list[tuple[str, str]],
    total: int,
) -> PatchFailed:
    listed = ", ".join(f"{name} ({reason})" for name, reason in failures)
    package = project.manifest.upstream.package
    if moving:
        kept = f"the pin stays at {lock.version}" if lock else "nothing was pinned"
        return PatchFailed(
            f"{package} {version}: {len(failures)} of {total} patches no longer apply: {listed}; "
            f"{kept} and {project.label}/src is unchanged.",
            failures=failures,
            remediation=f"refresh each named patch against {version} (UPSTREAM.md, 'Moving a "
            "pin') and rerun.",
        )
    return PatchFailed(
        f"{project.label}: {listed} does not apply to {package} {version}"
        if len(failures) == 1
        else f"{project.label}: {len(failures)} patches do not apply to {package} {version}: "
        f"{listed}",
        failures=failures,
        remediation="regenerate the patch against the pristine release (UPSTREAM.md, 'Adding a "
        "patch') and rerun.",
    )


def _patched_tree(
    project: Project,
    archive: Path,
    tree: Path,
    series: list[Patch],
    *,
    version: str,
    lock: Lock | None,
    update: str | None,
) -> str:
    """Unpack the release into ``tree`` and apply the whole series; the pristine digest.

    Raises:
        PatchFailed: Patches do not apply (every failing one named).
    """
    unpack(archive, tree, project.manifest.upstream.distribution)
    pristine = tree_digest(file_digests(tree))
    failures = [
        (patch.name, reason)
        for patch in series
        if (reason := apply_patch(patch.path, tree)) is not None
    ]
    if failures:
        moving = update is not None and (lock is None or lock.version != update)
        raise _patch_failure(
            project, version, lock, moving=moving, failures=failures, total=len(series)
        )
    return pristine


def _lock_of(
    project: Project,
    version: str,
    release: Release,
    *,
    tree: Path,
    pristine: str,
    files: dict[str, str],
    series: list[Patch],
) -> Lock:
    """The lock record of a patched tree."""
    upstream = project.manifest.upstream
    return Lock(
        package=upstream.package,
        version=version,
        distribution=upstream.distribution,
        filename=release.filename,
        url=release.url,
        sha256=release.sha256,
        upstream_commit=_upstream_commit(tree),
        pristine_digest=pristine,
        tree_digest=tree_digest(files),
        patches=[LockedPatch(name=p.name, sha256=p.sha256) for p in series],
        files=files,
    )


def _refuse_drift(project: Project, lock: Lock, new_lock: Lock) -> NoReturn:
    """Raise TreeDrift naming what differs between the committed lock and the new one."""
    raise TreeDrift(
        f"{project.label}/{LOCK_FILE} is out of date: "
        f"{'; '.join(_lock_differences(lock, new_lock))}.",
        remediation=f"run `python -m tools.vendor sync {project.name}` and commit {LOCK_FILE}.",
    )


def sync_project(
    project: Project,
    *,
    cache_dir: Path | None = None,
    update: str | None = None,
    locked: bool = False,
) -> SyncReport:
    """Materialise ``third_party/<name>/src`` as the pinned release plus the patch series.

    Args:
        project: The project to sync.
        cache_dir: Folder holding (or receiving) distribution files; default
            ``third_party/.cache``.
        update: Move the pin to this version (resolved on the manifest's index) and re-lock.
        locked: Fail instead of rewriting the lock when the result differs from it (CI).

    Returns:
        What was materialised and whether the lock changed.

    Raises:
        NotSynced: No lock and no ``update``.
        DistributionMismatch: The distribution's SHA-256 differs from the pin.
        PatchFailed: Patches do not apply (all of them named; pin and tree unchanged).
        Dep3HeaderError: A patch lacks a required DEP-3 field.
        LicenseError: The license guard failed.
        TreeDrift: ``locked`` and the result differs from the lock.
        ToolMissing: The index is unreachable or git is missing.
        VendorInputError: Invalid manifest, lock or flags.
    """
    if locked and update is not None:
        raise VendorInputError(
            "--locked keeps every pin as it is, so it cannot be combined with --update.",
            remediation="drop one of the two flags.",
        )
    third_party = project.root.parent
    cache = cache_dir if cache_dir is not None else third_party / CACHE_DIR
    lock = project.load_lock()
    series = patch_series(project.patches_dir)
    for patch in series:
        check_dep3(patch.path)
    version, release = _target_release(project, lock, update)
    archive = fetch_distribution(release.url, release.filename, release.sha256, cache)

    staging_root = third_party / CACHE_DIR
    staging_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=staging_root, prefix=f"{project.name}.staging-"))
    try:
        tree = staging / "src"
        pristine = _patched_tree(
            project, archive, tree, series, version=version, lock=lock, update=update
        )
        files = file_digests(tree)
        license_status = check_license(project, tree)
        new_lock = _lock_of(
            project, version, release, tree=tree, pristine=pristine, files=files, series=series
        )
        lock_changed = new_lock != lock
        if locked and lock is not None and lock_changed:
            _refuse_drift(project, lock, new_lock)
        if project.src.exists():
            project.src.rename(staging / "previous")
        tree.rename(project.src)
        if lock_changed:
            project.write_lock(new_lock)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return SyncReport(
        project=project.name,
        package=new_lock.package,
        version=version,
        previous_version=lock.version if lock else None,
        filename=release.filename,
        sha256=release.sha256,
        upstream_commit=new_lock.upstream_commit,
        patches=len(series),
        files=len(files),
        tree_digest=new_lock.tree_digest,
        lock_changed=lock_changed,
        license=license_status,
    )
