"""The license guard: a vendored tree carries its license file, or a recorded exception.

It also reads the release's own metadata (``PKG-INFO`` or ``*.dist-info/METADATA``) and fails
when upstream declares a license other than the manifest's SPDX id, so a relicensing upstream
is caught when a pin moves.
"""

from __future__ import annotations

import email.parser
from dataclasses import dataclass
from pathlib import Path

from tools.vendor.errors import LicenseError
from tools.vendor.manifest import MANIFEST_FILE, Project

_LICENSE_STEMS = ("LICENSE", "LICENCE", "COPYING")


@dataclass(frozen=True)
class LicenseStatus:
    """Outcome of the license guard for one tree.

    Attributes:
        spdx: The manifest's SPDX id.
        file: License file path inside the tree, or None when an exception covers its absence.
        notes: Advice that is not an error (e.g. upstream now ships the missing file).
    """

    spdx: str
    file: str | None
    notes: tuple[str, ...] = ()


def _declared_license(tree: Path) -> tuple[str, str] | None:
    """``(metadata file, declared license)`` from the release's core metadata, if any."""
    candidates = [tree / "PKG-INFO", *sorted(tree.glob("*.dist-info/METADATA"))]
    for path in candidates:
        if not path.is_file():
            continue
        meta = email.parser.HeaderParser().parsestr(path.read_text(encoding="utf-8"))
        declared = meta.get("License-Expression") or meta.get("License")
        if declared:
            return path.relative_to(tree).as_posix(), " ".join(str(declared).split())
    return None


def _license_files(tree: Path) -> list[str]:
    found = [
        p.relative_to(tree).as_posix()
        for pattern in ("*", "*.dist-info/licenses/*")
        for p in tree.glob(pattern)
        if p.is_file() and p.name.upper().startswith(_LICENSE_STEMS)
    ]
    return sorted(found)


def check_license(project: Project, tree: Path) -> LicenseStatus:
    """Run the license guard on ``tree`` (pristine plus patches) of ``project``.

    Args:
        project: The project whose manifest gives the policy.
        tree: Root of the materialised tree.

    Returns:
        The license file found (or None under a recorded exception) and any notes.

    Raises:
        LicenseError: No license file and no exception, or upstream metadata declares another
            license than the manifest.
    """
    policy = project.manifest.license
    declared = _declared_license(tree)
    if declared is not None and declared[1] != policy.spdx:
        raise LicenseError(
            f"{project.label}: upstream {declared[0]} declares license '{declared[1]}' but "
            f"{MANIFEST_FILE} records '{policy.spdx}'.",
            remediation="review the new license before vendoring, then update license.spdx.",
        )
    located = sorted(p for p in tree.glob(policy.file) if p.is_file()) if policy.file else []
    if located:
        return LicenseStatus(spdx=policy.spdx, file=located[0].relative_to(tree).as_posix())
    exception = policy.exception
    if exception is None:
        where = f"'{policy.file}'" if policy.file else "a license file"
        raise LicenseError(
            f"{project.label}/src has no {where} and {MANIFEST_FILE} records no license exception.",
            remediation="vendor a release that ships its license, or record "
            "[license.exception] with the reason, source and date.",
        )
    notes: list[str] = []
    shipped = _license_files(tree)
    if shipped:
        notes.append(
            f"upstream now ships {', '.join(shipped)}: set license.file and drop the "
            f"exception ({exception.sync_note})"
        )
    return LicenseStatus(spdx=policy.spdx, file=None, notes=tuple(notes))
