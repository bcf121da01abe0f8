"""A Debian base image built from an apt mirror, for sites that reach no container registry.

``mmdebstrap`` builds a root filesystem of a pinned Debian suite from an apt mirror (the host's
configured one by default) and writes it as a tar stream, which ``docker import`` turns into an
image. With a Debian snapshot timestamp, the mirror is ``snapshot.debian.org`` at that moment and
``SOURCE_DATE_EPOCH`` is that moment, so the same timestamp gives the same packages (mmdebstrap
then produces reproducible file times).

The base holds what the Dockerfile needs and nothing more: Python 3 with ``venv``, the CA store,
and ``passwd`` (``useradd``). Documentation, man pages and locales are left out, except the
copyright files.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from lensemble.errors import ToolMissing, UsageError
from lensemble.image import ImageBuildFailed
from lensemble.image.client import image_size

#: The suite Lensemble's images are built and tested on (Python 3.11, as constraints.txt).
DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
SNAPSHOT_MIRROR = "http://snapshot.debian.org/archive/debian/{timestamp}"
#: Packages the Dockerfile relies on (python3 -m venv, the CA store, useradd).
PACKAGES = ("python3", "python3-venv", "ca-certificates", "passwd")
#: dpkg filters that keep documentation out of the image (copyright files stay).
DPKG_FILTERS = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
)
#: Seconds the whole base build may take (docs/performance.md#images-and-the-compose-stack).
BASE_TIMEOUT_S = 1800.0
_SNAPSHOT = re.compile(r"^\d{8}T\d{6}Z$")

Echo = Callable[[str], None]


@dataclass(frozen=True)
class BaseImage:
    """A Debian base image that ``lensemble image base`` imported.

    Attributes:
        tag: Image reference, e.g. ``lensemble-base:bookworm``.
        suite: Debian suite.
        mirror: The apt mirror the packages came from.
        seconds: Wall seconds of the build and import.
        size_bytes: Image size as the engine reports it (bytes).
    """

    tag: str
    suite: str
    mirror: str
    seconds: float
    size_bytes: int


def _apt_source_files(sources_list: Path, sources_dir: Path) -> list[Path]:
    files = [sources_list] if sources_list.is_file() else []
    if sources_dir.is_dir():
        files += sorted(p for p in sources_dir.iterdir() if p.suffix in (".list", ".sources"))
    return files


def _source_uris(text: str) -> list[str]:
    """The archive URIs of one apt sources file, one-line (``deb URI ...``) or deb822."""
    uris: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("deb "):
            parts = [p for p in line.split() if not p.startswith("[")]
            if len(parts) > 1:
                uris.append(parts[1])
        elif line.lower().startswith("uris:"):
            uris.extend(line.split(":", 1)[1].split())
    return uris


def host_debian_mirror(
    sources_list: Path = Path("/etc/apt/sources.list"),
    sources_dir: Path = Path("/etc/apt/sources.list.d"),
) -> str | None:
    """The first Debian archive mirror the host's apt uses, None when it names none.

    Reads one-line ``deb URI SUITE ...`` entries and deb822 ``.sources`` files (``URIs:``);
    security and other archives (``debian-security``) are skipped.
    """
    uris: list[str] = []
    for path in _apt_source_files(sources_list, sources_dir):
        try:
            uris += _source_uris(path.read_text(encoding="utf-8"))
        except OSError:
            continue
    for uri in uris:
        if "://" in uri and uri.rstrip("/").endswith("/debian"):
            return uri.rstrip("/")
    return None


def snapshot_epoch(timestamp: str) -> int:
    """Seconds since the epoch of a Debian snapshot timestamp (``20250520T000000Z``).

    Raises:
        UsageError: The timestamp is not of the form ``YYYYMMDDTHHMMSSZ``.
    """
    if not _SNAPSHOT.match(timestamp):
        raise UsageError(
            f"--snapshot '{timestamp}' is not a Debian snapshot timestamp;",
            remediation="use the form YYYYMMDDTHHMMSSZ, e.g. 20250520T000000Z.",
        )
    return int(datetime.strptime(timestamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp())


def mmdebstrap_command(
    suite: str, mirror: str, *, snapshot: str | None = None, packages: tuple[str, ...] = PACKAGES
) -> list[str]:
    """The ``mmdebstrap`` command that writes the base's root filesystem as a tar to stdout."""
    args = [
        "mmdebstrap",
        "--quiet",
        "--variant=apt",
        "--format=tar",
        f"--include={','.join(packages)}",
        *(f"--dpkgopt={f}" for f in DPKG_FILTERS),
    ]
    if snapshot:
        # Snapshots keep their old Release files: apt must not refuse them as expired.
        args.append("--aptopt=Acquire::Check-Valid-Until false")
    return [*args, suite, "-", mirror]


def import_command(docker: str, tag: str, suite: str, mirror: str) -> list[str]:
    """The ``docker import`` command that reads the tar from stdin and tags the base."""
    return [
        docker,
        "import",
        "--change",
        'CMD ["python3"]',
        "--change",
        f"LABEL dev.lensemble.base.suite={suite}",
        "--change",
        f"LABEL dev.lensemble.base.mirror={mirror}",
        "-",
        tag,
    ]


def build_base(
    *,
    tag: str,
    suite: str = DEFAULT_SUITE,
    mirror: str | None = None,
    snapshot: str | None = None,
    docker: str = "docker",
    echo: Echo = print,
    clock: Callable[[], float] = time.monotonic,
) -> BaseImage:
    """Build a Debian base image with ``mmdebstrap`` and ``docker import`` it as ``tag``.

    Args:
        tag: Image reference to create, e.g. ``lensemble-base:bookworm``.
        suite: Debian suite (pinned; Python 3.11 on bookworm).
        mirror: apt mirror URI; None uses the host's configured Debian mirror, else
            deb.debian.org. Ignored with ``snapshot``.
        snapshot: Debian snapshot timestamp (``YYYYMMDDTHHMMSSZ``) for a reproducible base.
        docker: The ``docker`` executable.
        echo: Prints progress.
        clock: Monotonic clock (seconds).

    Returns:
        What was imported, with the build's wall seconds and the image size.

    Raises:
        ToolMissing: ``mmdebstrap`` or ``docker`` is missing.
        UsageError: The snapshot timestamp is malformed.
        ImageBuildFailed: ``mmdebstrap`` or ``docker import`` failed (their last error line).
    """
    _require_tools(docker)
    env = None
    if snapshot:
        epoch = snapshot_epoch(snapshot)
        mirror = SNAPSHOT_MIRROR.format(timestamp=snapshot)
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch)}
    else:
        mirror = mirror or host_debian_mirror() or DEFAULT_MIRROR
    echo(f"building Debian {suite} base from {mirror} with mmdebstrap")
    start = clock()
    _strap_into_import(
        mmdebstrap_command(suite, mirror, snapshot=snapshot),
        import_command(docker, tag, suite, mirror),
        env=env,
        what=f"Debian {suite} from {mirror}",
        mirror=mirror,
    )
    seconds = clock() - start
    size = image_size(docker, tag)
    echo(f"imported {tag}: Debian {suite}, {size / 1e6:.0f} MB, {seconds:.0f} s")
    return BaseImage(tag=tag, suite=suite, mirror=mirror, seconds=seconds, size_bytes=size)


def _require_tools(docker: str) -> None:
    if shutil.which("mmdebstrap") is None:
        raise ToolMissing(
            "`mmdebstrap` is not installed, so no Debian base can be built.",
            remediation="Install it (Debian: `apt-get install mmdebstrap`), or build on a "
            "registry image with `lensemble image build --base IMAGE`.",
        )
    if shutil.which(docker) is None:
        raise ToolMissing(
            f"`{docker}` is not installed.",
            remediation="Install Docker (Debian: `apt-get install docker.io`).",
        )


def _strap_into_import(
    strap_args: list[str],
    import_args: list[str],
    *,
    env: dict[str, str] | None,
    what: str,
    mirror: str,
) -> None:
    """Pipe mmdebstrap's tar stream into ``docker import``, within :data:`BASE_TIMEOUT_S`.

    Raises:
        ImageBuildFailed: Either command failed (its telling line), or time ran out.
    """
    # mmdebstrap's messages go to a file, not a pipe: a full, unread stderr pipe would block it
    # while `docker import` waits for the rest of its tar stream.
    with tempfile.TemporaryFile() as strap_log:
        strap = subprocess.Popen(strap_args, stdout=subprocess.PIPE, stderr=strap_log, env=env)
        assert strap.stdout is not None  # guaranteed by stdout=PIPE
        try:
            imported = subprocess.run(
                import_args,
                stdin=strap.stdout,
                capture_output=True,
                text=True,
                timeout=BASE_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            strap.kill()
            strap.wait()
            raise ImageBuildFailed(
                f"The Debian base build did not finish within {BASE_TIMEOUT_S:.0f} s.",
                remediation=f"Check that the mirror {mirror} answers (`apt-get update`).",
            ) from None
        finally:
            strap.stdout.close()
        strap_code = strap.wait()
        strap_log.seek(0)
        strap_err = strap_log.read().decode(errors="replace")
    if strap_code != 0:
        raise ImageBuildFailed(
            f"mmdebstrap could not build {what} ({_first_error(strap_err)}).",
            remediation="Check the suite and the mirror (--mirror, --snapshot).",
        )
    if imported.returncode != 0:
        raise ImageBuildFailed(
            f"`docker import` of the Debian base failed: {_last_line(imported.stderr)}",
            remediation="Check that the Docker engine answers (`docker info`).",
        )


def _first_error(text: str) -> str:
    """The first ``E:`` line of mmdebstrap (its last one only says that it failed)."""
    for line in text.splitlines():
        if line.startswith("E: "):
            return line.removeprefix("E: ").strip()
    return _last_line(text)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
