"""Resolve a pinned release on a package index and fetch it, verified by SHA-256.

Resolution uses the standard simple-index JSON API (PEP 691), which PyPI and its mirrors serve;
downloads go through ``urllib``. A distribution is used only when its SHA-256 equals the pin: a
file in the cache folder is re-hashed on every use, a download is hashed while it streams and
discarded on mismatch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from lensemble import __version__
from lensemble.errors import ToolMissing
from tools.vendor.digest import sha256_file
from tools.vendor.errors import DistributionMismatch, VendorInputError
from tools.vendor.manifest import Distribution

_SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
_TIMEOUT_S = 60.0
_USER_AGENT = f"lensemble-vendor/{__version__}"


@dataclass(frozen=True)
class Release:
    """One distribution file of a release on the index.

    Attributes:
        filename: File name, e.g. ``stable_worldmodel-0.1.1.tar.gz``.
        url: Absolute download URL.
        sha256: SHA-256 the index publishes for the file (hex).
    """

    filename: str
    url: str
    sha256: str


def _open(url: str, accept: str | None = None) -> Any:
    headers = {"User-Agent": _USER_AGENT}
    if accept:
        headers["Accept"] = accept
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 (http(s) or file only)
    return urllib.request.urlopen(request, timeout=_TIMEOUT_S)  # noqa: S310


def _check_scheme(url: str) -> None:
    if urllib.parse.urlsplit(url).scheme not in ("https", "http", "file"):
        raise VendorInputError(
            f"unsupported URL '{url}'.", remediation="use an https:// (or file://) URL."
        )


def _matches(filename: str, package: str, version: Version, distribution: Distribution) -> bool:
    try:
        if distribution == "sdist":
            if not filename.endswith(".tar.gz"):
                return False
            name, found = parse_sdist_filename(filename)
            return name == canonicalize_name(package) and found == version
        if not filename.endswith(".whl"):
            return False
        name, found, _build, tags = parse_wheel_filename(filename)
    except (InvalidSdistFilename, InvalidWheelFilename, InvalidVersion):
        return False
    pure = any(tag.abi == "none" and tag.platform == "any" for tag in tags)
    return name == canonicalize_name(package) and found == version and pure


def resolve_release(
    index_url: str, package: str, version: str, distribution: Distribution
) -> Release:
    """Find the ``distribution`` file of ``package==version`` on a simple index (PEP 691).

    Args:
        index_url: Base of the simple index, e.g. ``https://pypi.org/simple``.
        package: Distribution name.
        version: Exact release version.
        distribution: ``sdist`` (a ``.tar.gz``) or ``wheel`` (a pure-Python ``.whl``).

    Returns:
        The file's name, absolute URL and published SHA-256.

    Raises:
        VendorInputError: The version is invalid or the release has no such file.
        ToolMissing: The index is unreachable or answers with something that is not PEP 691.
    """
    try:
        wanted = Version(version)
    except InvalidVersion:
        raise VendorInputError(
            f"'{version}' is not a valid version for {package}.",
            remediation="use --update NAME==VERSION with a release version, e.g. 0.1.1.",
        ) from None
    _check_scheme(index_url)
    page = f"{index_url.rstrip('/')}/{canonicalize_name(package)}/"
    try:
        with _open(page, accept=_SIMPLE_JSON) as response:
            data = json.load(response)
        files = data["files"]
    except (urllib.error.URLError, OSError) as exc:
        raise ToolMissing(
            f"cannot reach the package index at {page} ({exc}).",
            remediation="check network access to the index, or set upstream.index_url.",
        ) from None
    except (ValueError, KeyError, TypeError):
        raise ToolMissing(
            f"{page} did not answer with the simple-index JSON API (PEP 691).",
            remediation="point upstream.index_url at a PEP 691 index such as PyPI's.",
        ) from None
    for entry in files:
        filename = str(entry.get("filename", ""))
        sha256 = entry.get("hashes", {}).get("sha256")
        if sha256 and _matches(filename, package, wanted, distribution):
            return Release(filename, urllib.parse.urljoin(page, entry["url"]), sha256)
    versions = data.get("versions") or []
    recent = ", ".join(str(v) for v in versions[-5:]) or "none listed"
    raise VendorInputError(
        f"{package}=={version} has no {distribution} on {index_url} (recent versions: {recent}).",
        remediation="pick a version the index has, or change upstream.distribution.",
    )


def fetch_distribution(url: str, filename: str, sha256: str, cache_dir: Path) -> Path:
    """The distribution file, from ``cache_dir`` when present there, else downloaded into it.

    Args:
        url: Download URL (https, http or file).
        filename: Plain file name the distribution is cached under.
        sha256: Pinned SHA-256 (hex) the file must have.
        cache_dir: Cache folder (created when missing).

    Returns:
        Path of the verified file inside ``cache_dir``.

    Raises:
        DistributionMismatch: The cached or downloaded file has another SHA-256 (fail closed).
        ToolMissing: The download failed.
        VendorInputError: ``filename`` is not a plain file name or the URL scheme is unsupported.
    """
    if Path(filename).name != filename or filename in ("", ".", ".."):
        raise VendorInputError(f"'{filename}' is not a plain distribution file name.")
    cache_dir.mkdir(parents=True, exist_ok=True)
    cached = cache_dir / filename
    if cached.is_file():
        actual = sha256_file(cached)
        if actual != sha256:
            raise DistributionMismatch(
                f"{cached} has SHA-256 {actual} but the lock pins {sha256}.",
                remediation="delete that file and rerun; a distribution that does not match "
                "its pin is never unpacked.",
            )
        return cached
    _check_scheme(url)
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(dir=cache_dir, prefix=f".{filename}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, _open(url) as response:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    except (urllib.error.URLError, OSError) as exc:
        tmp.unlink(missing_ok=True)
        raise ToolMissing(
            f"cannot download {url} ({exc}).",
            remediation=f"check network access to the index, or put {filename} into {cache_dir}.",
        ) from None
    actual = digest.hexdigest()
    if actual != sha256:
        tmp.unlink(missing_ok=True)
        raise DistributionMismatch(
            f"{url} served a file with SHA-256 {actual} but the lock pins {sha256}.",
            remediation="do not vendor it; check the index and the lock's url and sha256.",
        )
    with contextlib.suppress(FileNotFoundError):
        cached.unlink()
    tmp.replace(cached)
    return cached
