"""Unpack a distribution byte for byte: every regular file's bytes exactly as upstream has them.

An sdist (``.tar.gz``) loses its single top-level ``<name>-<version>/`` folder; a wheel is
unpacked as is (package folders plus ``*.dist-info``). Links, devices, absolute paths and
``..`` are refused rather than sanitised: a distribution that has them is not vendored.
"""

from __future__ import annotations

import tarfile
import zipfile
from pathlib import Path, PurePosixPath

from tools.vendor.errors import VendorInputError
from tools.vendor.manifest import Distribution


def _safe_relative(name: str, archive: Path) -> PurePosixPath:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or "\\" in name or not path.parts:
        raise VendorInputError(
            f"{archive.name} contains the unsafe path '{name}'.",
            remediation="do not vendor this distribution.",
        )
    return path


def _write(dest: Path, rel: PurePosixPath, data: bytes, seen: set[PurePosixPath]) -> None:
    if rel in seen:
        raise VendorInputError(f"the distribution lists '{rel}' twice.")
    seen.add(rel)
    target = dest.joinpath(*rel.parts)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)


def _unpack_sdist(archive: Path, dest: Path) -> None:
    seen: set[PurePosixPath] = set()
    with tarfile.open(archive, "r:gz") as tar:
        members = tar.getmembers()
        tops = {_safe_relative(m.name, archive).parts[0] for m in members}
        if len(tops) != 1:
            raise VendorInputError(
                f"{archive.name} does not have exactly one top-level folder ({len(tops)} found).",
                remediation="vendor the wheel instead (upstream.distribution = 'wheel').",
            )
        for member in members:
            rel = _safe_relative(member.name, archive)
            if member.isdir():
                continue
            if not member.isreg():
                raise VendorInputError(
                    f"{archive.name} contains '{member.name}', which is not a regular file.",
                    remediation="do not vendor a distribution with links or device files.",
                )
            handle = tar.extractfile(member)
            if handle is None or len(rel.parts) < 2:
                raise VendorInputError(f"{archive.name}: cannot read '{member.name}'.")
            _write(dest, PurePosixPath(*rel.parts[1:]), handle.read(), seen)


def _unpack_wheel(archive: Path, dest: Path) -> None:
    seen: set[PurePosixPath] = set()
    with zipfile.ZipFile(archive) as whl:
        for info in whl.infolist():
            rel = _safe_relative(info.filename, archive)
            if info.is_dir():
                continue
            # A zip entry's upper mode bits say whether it is a symbolic link (S_IFLNK).
            if (info.external_attr >> 16) & 0o170000 == 0o120000:
                raise VendorInputError(
                    f"{archive.name} contains the link '{info.filename}'.",
                    remediation="do not vendor a distribution with links.",
                )
            _write(dest, rel, whl.read(info), seen)


def unpack(archive: Path, dest: Path, distribution: Distribution) -> None:
    """Unpack ``archive`` into the (new, empty) folder ``dest``.

    Args:
        archive: The verified distribution file.
        dest: Target folder; created.
        distribution: ``sdist`` or ``wheel``.

    Raises:
        VendorInputError: The archive is corrupt or holds an unsafe entry (link, ``..``,
            absolute path, duplicate).
    """
    dest.mkdir(parents=True, exist_ok=False)
    try:
        if distribution == "sdist":
            _unpack_sdist(archive, dest)
        else:
            _unpack_wheel(archive, dest)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
        raise VendorInputError(
            f"cannot unpack {archive.name} ({exc}).",
            remediation="delete it from the cache folder and rerun.",
        ) from None
