"""The drift guard: the vendored tree must equal pristine upstream plus the patch series.

The lock (``vendor.lock.json``) is the record of "pristine plus patches": ``sync`` writes it
from a SHA-256 verified release, and CI re-derives it from the index. ``check`` then needs no
network: it compares the patch files with the lock, and every file of ``src/`` with the lock's
per-file SHA-256, naming the first files that differ.
"""

from __future__ import annotations

from dataclasses import dataclass

from tools.vendor.digest import diff_trees, file_digests, tree_digest
from tools.vendor.errors import NotSynced, TreeDrift, VendorInputError
from tools.vendor.license import LicenseStatus, check_license
from tools.vendor.manifest import LOCK_FILE, Lock, LockedPatch, Project
from tools.vendor.patches import check_dep3, patch_series

_SHOWN = 5


@dataclass(frozen=True)
class CheckReport:
    """A clean check of one project.

    Attributes:
        project: Directory name under ``third_party/``.
        package: Distribution name on the index.
        version: Pinned release.
        files: Number of files in the tree.
        patches: Number of patches in the series.
        tree_digest: Digest of the tree (equals the lock's).
        license: Outcome of the license guard.
    """

    project: str
    package: str
    version: str
    files: int
    patches: int
    tree_digest: str
    license: LicenseStatus


def series_changes(locked: list[LockedPatch], current: list[LockedPatch]) -> list[str]:
    """How the patch series on disk differs from the locked one, e.g. ``0002-x.patch (new)``."""
    before = {p.name: p.sha256 for p in locked}
    after = {p.name: p.sha256 for p in current}
    changes = [f"{n} (new)" for n in after if n not in before]
    changes += [f"{n} (removed)" for n in before if n not in after]
    changes += [f"{n} (edited)" for n in after if n in before and before[n] != after[n]]
    if not changes and [p.name for p in locked] != [p.name for p in current]:
        changes.append("order changed")
    return sorted(changes)


def describe_differences(paths: list[str], total: int) -> str:
    """``a (modified), b (added) and 3 more`` for messages."""
    shown = ", ".join(paths)
    return f"{shown} and {total - len(paths)} more" if total > len(paths) else shown


def check_metadata(project: Project) -> Lock:
    """The checks that need no tree: lock present and self-consistent, DEP-3, series locked.

    Returns:
        The validated lock.

    Raises:
        NotSynced: The project has no lock yet.
        VendorInputError: Manifest and lock disagree, or a patch is misnamed.
        Dep3HeaderError: A patch lacks a required DEP-3 field.
        TreeDrift: The patch series or the lock's file map changed since the lock was written.
    """
    lock = project.load_lock()
    if lock is None:
        raise NotSynced(
            f"{project.label} has no {LOCK_FILE}.",
            remediation=f"pin a release: `python -m tools.vendor sync {project.name} "
            f"--update {project.manifest.upstream.package}==VERSION`.",
        )
    upstream = project.manifest.upstream
    if (lock.package, lock.distribution) != (upstream.package, upstream.distribution):
        raise VendorInputError(
            f"{project.label}: vendor.toml asks for the {upstream.distribution} of "
            f"{upstream.package} but the lock has the {lock.distribution} of {lock.package}.",
            remediation=f"re-pin with `python -m tools.vendor sync {project.name} --update "
            f"{upstream.package}==VERSION`.",
        )
    series = patch_series(project.patches_dir)
    for patch in series:
        check_dep3(patch.path)
    current = [LockedPatch(name=p.name, sha256=p.sha256) for p in series]
    changes = series_changes(lock.patches, current)
    if changes:
        raise TreeDrift(
            f"{project.label}: the patch series changed since the lock was written "
            f"({', '.join(changes)}).",
            remediation=f"run `python -m tools.vendor sync {project.name}` and commit {LOCK_FILE}.",
        )
    if tree_digest(lock.files) != lock.tree_digest:
        raise TreeDrift(
            f"{project.label}/{LOCK_FILE}: the file map does not match tree_digest "
            "(the lock was edited by hand).",
            remediation="restore it from git or rerun "
            f"`python -m tools.vendor sync {project.name}`.",
        )
    return lock


def check_project(project: Project) -> CheckReport:
    """Run the drift, DEP-3 and license guards on one project's materialised tree.

    Raises:
        NotSynced: No lock, or ``src/`` is missing.
        TreeDrift: The tree or the patch series differs from the lock (names the first files).
        Dep3HeaderError: A patch lacks a required DEP-3 field.
        LicenseError: No license file and no recorded exception, or a changed license.
        VendorInputError: Manifest or lock invalid or inconsistent.
    """
    lock = check_metadata(project)
    if not project.src.is_dir():
        raise NotSynced(
            f"{project.label}/src is missing (upstream source is not committed).",
            remediation=f"materialise it with `python -m tools.vendor sync {project.name}`.",
        )
    diff = diff_trees(lock.files, file_digests(project.src))
    if not diff.clean:
        total = len(diff.modified) + len(diff.added) + len(diff.removed)
        raise TreeDrift(
            f"{project.label}/src differs from {lock.package} {lock.version} plus its patches: "
            f"{describe_differences(diff.first(_SHOWN), total)}.",
            modified=diff.modified,
            added=diff.added,
            removed=diff.removed,
            remediation="never edit the tree in place: restore it with "
            f"`python -m tools.vendor sync {project.name}` and put changes in a new patch under "
            "patches/.",
        )
    license_status = check_license(project, project.src)
    return CheckReport(
        project=project.name,
        package=lock.package,
        version=lock.version,
        files=len(lock.files),
        patches=len(lock.patches),
        tree_digest=lock.tree_digest,
        license=license_status,
    )
