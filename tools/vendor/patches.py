"""The patch series: naming, DEP-3 headers, and applying each patch with ``git apply``.

Patches are ``patches/NNNN-short-name.patch``, applied in name order over the pristine tree.
Each starts with a DEP-3 header (https://dep-team.pages.debian.net/deps/dep3/); we require
Description (or Subject), Origin, Forwarded and Last-Update. Applying uses ``git apply``
(atomic per patch, no fuzz), run with ``GIT_CEILING_DIRECTORIES`` so that git treats the tree
as a plain folder even though it sits inside our own repository.
"""

from __future__ import annotations

import datetime
import email.parser
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from lensemble.errors import ToolMissing
from tools.vendor.digest import sha256_file
from tools.vendor.errors import Dep3HeaderError, VendorInputError

PATCH_NAME = re.compile(r"^\d{4}-[A-Za-z0-9][A-Za-z0-9._-]*\.patch$")

#: DEP-3 fields every patch must carry (``Subject`` may stand for ``Description``).
REQUIRED_DEP3_FIELDS = ("Description", "Origin", "Forwarded", "Last-Update")

_DIFF_START = ("---", "diff ", "Index:")


@dataclass(frozen=True)
class Patch:
    """One patch file of a series.

    Attributes:
        path: The file.
        name: Its file name, e.g. ``0001-lazy-top-level-imports.patch``.
        sha256: SHA-256 of the file (hex).
    """

    path: Path
    name: str
    sha256: str


def patch_series(patches_dir: Path) -> list[Patch]:
    """The patches of ``patches_dir`` in application order (by name); none when it is absent.

    Dotfiles (``.gitkeep``) and ``README*`` are ignored; any other file must be named
    ``NNNN-name.patch``.

    Raises:
        VendorInputError: A file does not follow the naming rule, or two share a number.
    """
    if not patches_dir.is_dir():
        return []
    series: list[Patch] = []
    numbers: dict[str, str] = {}
    for path in sorted(patches_dir.iterdir()):
        if path.name.startswith(".") or path.name.startswith("README"):
            continue
        if not path.is_file() or not PATCH_NAME.match(path.name):
            raise VendorInputError(
                f"{path} is not named NNNN-short-name.patch.",
                remediation="rename it (four digits give the order) or move it out of patches/.",
            )
        number = path.name[:4]
        if number in numbers:
            raise VendorInputError(
                f"{path.name} and {numbers[number]} share the number {number}.",
                remediation="renumber one of them so the order is explicit.",
            )
        numbers[number] = path.name
        series.append(Patch(path=path, name=path.name, sha256=sha256_file(path)))
    return series


def dep3_header(patch: Path) -> dict[str, str]:
    """The DEP-3 fields of a patch: the RFC 822 style paragraph before the diff starts."""
    lines: list[str] = []
    for line in patch.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith(_DIFF_START) or not line.strip():
            break
        lines.append(line)
    message = email.parser.HeaderParser().parsestr("\n".join(lines) + "\n\n")
    return {key: " ".join(str(value).split()) for key, value in message.items()}


def check_dep3(patch: Path) -> dict[str, str]:
    """Validate a patch's DEP-3 header and return its fields.

    Raises:
        Dep3HeaderError: A required field is missing or empty, or Last-Update is not a date.
    """
    fields = dep3_header(patch)
    if fields.get("Subject") and not fields.get("Description"):
        fields["Description"] = fields["Subject"]
    missing = [f for f in REQUIRED_DEP3_FIELDS if not fields.get(f)]
    if missing:
        raise Dep3HeaderError(
            f"patch {patch.name} lacks the DEP-3 field{'s' if len(missing) > 1 else ''} "
            f"{', '.join(missing)}.",
            remediation="add them to the header above the diff (see an existing patch).",
        )
    try:
        datetime.date.fromisoformat(fields["Last-Update"])
    except ValueError:
        raise Dep3HeaderError(
            f"patch {patch.name} has Last-Update '{fields['Last-Update']}', not a YYYY-MM-DD date.",
            remediation="write the date the patch last changed as YYYY-MM-DD.",
        ) from None
    return fields


def _git() -> str:
    git = shutil.which("git")
    if git is None:
        raise ToolMissing(
            "git is needed to apply the patch series (git apply) but is not on PATH.",
            remediation="install git (e.g. apt-get install git).",
        )
    return git


def apply_patch(patch: Path, tree: Path) -> str | None:
    """Apply one patch to ``tree`` with ``git apply -p1``; all of it or nothing.

    Args:
        patch: The patch file.
        tree: Root of the tree the patch's ``a/`` and ``b/`` paths are relative to.

    Returns:
        None when the patch applied, else git's reason in one line (the tree is unchanged).

    Raises:
        ToolMissing: git is not installed.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    # Stop git from discovering the enclosing repository: inside one, git apply silently
    # skips paths outside the index instead of patching the folder.
    env["GIT_CEILING_DIRECTORIES"] = str(tree.resolve().parent)
    proc = subprocess.run(
        [_git(), "apply", "-p1", "--whitespace=nowarn", str(patch.resolve())],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode == 0:
        return None
    errors = [ln.removeprefix("error: ") for ln in proc.stderr.splitlines() if ln.strip()]
    return "; ".join(errors[:2]) or f"git apply exited with {proc.returncode}"
