"""The manifest and the lock of one vendored project, and where its files live.

The manifest (``vendor.toml``, edited by people) says what we vendor and under which license
policy; the lock (``vendor.lock.json``, written by ``python -m tools.vendor sync``) records exactly
what was materialised: the pinned release, its SHA-256, and the digest and per-file SHA-256 of
the tree after the patch series. Field names follow moz.yaml / OpenTitan's vendor.hjson where
one exists (anchors §3).
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tools.vendor.errors import VendorInputError

MANIFEST_FILE = "vendor.toml"
LOCK_FILE = "vendor.lock.json"
SRC_DIR = "src"
PATCHES_DIR = "patches"
CACHE_DIR = ".cache"

#: SPDX identifiers we accept for vendored code (permissive, compatible with Apache-2.0).
ALLOWED_LICENSES = frozenset(
    {"MIT", "BSD-2-Clause", "BSD-3-Clause", "Apache-2.0", "ISC", "PSF-2.0", "Zlib"}
)

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Distribution = Literal["sdist", "wheel"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Upstream(_Strict):
    """Where the project comes from.

    Attributes:
        package: Distribution name on the package index, e.g. ``stable-worldmodel``.
        distribution: Which file of a release is vendored: the ``sdist`` or the pure-Python
            ``wheel``.
        index_url: PEP 503/691 simple index the release is resolved from on ``--update``.
        repository: Upstream source repository (for people and upstream contributions).
        import_names: Top-level Python packages the tree provides; only the shim imports them.
    """

    package: str = Field(min_length=1)
    distribution: Distribution
    index_url: str = "https://pypi.org/simple"
    repository: str = ""
    import_names: list[str] = Field(min_length=1)


class LicenseException(_Strict):
    """Why a tree without a license file is still acceptable, and until when.

    Attributes:
        reason: One sentence: what is missing and why it is acceptable.
        source: Where the license was confirmed (URL, metadata field, maintainer statement).
        date: When it was confirmed.
        sync_note: What to do once upstream publishes the file.
    """

    reason: str = Field(min_length=1)
    source: str = Field(min_length=1)
    date: datetime.date
    sync_note: str = Field(min_length=1)


class LicensePolicy(_Strict):
    """The license of the vendored tree.

    Attributes:
        spdx: SPDX identifier; must be one of :data:`ALLOWED_LICENSES`.
        file: Path of the license file inside the tree (POSIX, relative to ``src/``); may be a
            glob such as ``*.dist-info/licenses/LICENSE`` so that moving a pin needs no edit.
        exception: Recorded exception when the release ships no license file.
    """

    spdx: str
    file: str | None = None
    exception: LicenseException | None = None

    @model_validator(mode="after")
    def _known_and_located(self) -> LicensePolicy:
        if self.spdx not in ALLOWED_LICENSES:
            allowed = ", ".join(sorted(ALLOWED_LICENSES))
            raise ValueError(f"license '{self.spdx}' is not on the allow-list ({allowed})")
        if not self.file and self.exception is None:
            raise ValueError("give the license file path or record a [license.exception]")
        return self


class Manifest(_Strict):
    """``third_party/<name>/vendor.toml``."""

    upstream: Upstream
    license: LicensePolicy


class LockedPatch(_Strict):
    """One patch of the series as it was when the lock was written."""

    name: str
    sha256: Sha256


class Lock(_Strict):
    """``third_party/<name>/vendor.lock.json``: exactly what ``sync`` materialised.

    Attributes:
        lock_version: Format version of this file.
        package: Distribution name on the index.
        version: Pinned release.
        distribution: ``sdist`` or ``wheel``.
        filename: File name of the pinned distribution.
        url: Where the distribution is downloaded from.
        sha256: SHA-256 of the distribution file (hex).
        upstream_commit: Upstream VCS commit of the release when the distribution records it.
        pristine_digest: Tree digest of the unpacked release before patches.
        tree_digest: Tree digest after the patch series (what ``check`` enforces).
        patches: The patch series, in order, with each file's SHA-256.
        files: SHA-256 of every file of the patched tree, by POSIX path relative to ``src/``.
    """

    lock_version: Literal[1] = 1
    package: str
    version: str
    distribution: Distribution
    filename: str
    url: str
    sha256: Sha256
    upstream_commit: str | None = None
    pristine_digest: str
    tree_digest: str
    patches: list[LockedPatch]
    files: dict[str, Sha256]


def _problems(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(file)"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


@dataclass(frozen=True)
class Project:
    """One vendored project: ``third_party/<name>/`` and its manifest.

    Attributes:
        name: Directory name, e.g. ``stable_worldmodel``.
        root: ``third_party/<name>``.
        manifest: The validated manifest.
    """

    name: str
    root: Path
    manifest: Manifest

    @property
    def src(self) -> Path:
        """The materialised tree, ``third_party/<name>/src`` (git-ignored)."""
        return self.root / SRC_DIR

    @property
    def patches_dir(self) -> Path:
        """``third_party/<name>/patches``."""
        return self.root / PATCHES_DIR

    @property
    def lock_path(self) -> Path:
        """``third_party/<name>/vendor.lock.json``."""
        return self.root / LOCK_FILE

    @property
    def label(self) -> str:
        """``third_party/<name>`` for messages."""
        return f"{self.root.parent.name}/{self.name}"

    def load_lock(self) -> Lock | None:
        """Read the lock, or None when the project was never locked.

        Raises:
            VendorInputError: The lock file is not valid JSON or fails validation.
        """
        if not self.lock_path.is_file():
            return None
        try:
            return Lock.model_validate(json.loads(self.lock_path.read_text(encoding="utf-8")))
        except json.JSONDecodeError as exc:
            raise VendorInputError(
                f"{self.label}/{LOCK_FILE} is not valid JSON (line {exc.lineno}).",
                remediation="restore it from git or rerun "
                f"`python -m tools.vendor sync {self.name}`.",
            ) from None
        except ValidationError as exc:
            raise VendorInputError(
                f"{self.label}/{LOCK_FILE} is invalid: {_problems(exc)}.",
                remediation="restore it from git or rerun "
                f"`python -m tools.vendor sync {self.name}`.",
            ) from None

    def write_lock(self, lock: Lock) -> None:
        """Write the lock atomically (sorted file map, two-space indent, trailing newline)."""
        text = json.dumps(lock.model_dump(mode="json"), indent=2) + "\n"
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".vendor.lock.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        Path(tmp).replace(self.lock_path)


def _read_manifest(root: Path) -> Manifest:
    path = root / MANIFEST_FILE
    label = f"{root.parent.name}/{root.name}/{MANIFEST_FILE}"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise VendorInputError(f"{label} is not valid TOML: {exc}.") from None
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        raise VendorInputError(
            f"{label} is invalid: {_problems(exc)}.",
            remediation="fix the field named (see UPSTREAM.md of an existing project).",
        ) from None


def find_projects(third_party: Path) -> list[Project]:
    """Every project under ``third_party`` (a directory with a ``vendor.toml``), by name.

    Args:
        third_party: The ``third_party/`` directory.

    Raises:
        VendorInputError: The directory is missing or a manifest is invalid.
    """
    if not third_party.is_dir():
        raise VendorInputError(
            f"{third_party} is not a directory.",
            remediation="run from the repository root or pass --root.",
        )
    return [
        Project(name=d.name, root=d, manifest=_read_manifest(d))
        for d in sorted(third_party.iterdir())
        if (d / MANIFEST_FILE).is_file()
    ]


def load_project(third_party: Path, name: str) -> Project:
    """The project called ``name``: its directory name or its package name on the index.

    Raises:
        VendorInputError: No project has that name.
    """
    projects = find_projects(third_party)
    wanted = canonicalize_name(name)
    for project in projects:
        if project.name == name or canonicalize_name(project.manifest.upstream.package) == wanted:
            return project
    known = ", ".join(p.name for p in projects) or "none"
    raise VendorInputError(
        f"no vendored project '{name}' under {third_party} (known: {known}).",
        remediation="pass one of the known names.",
    )
