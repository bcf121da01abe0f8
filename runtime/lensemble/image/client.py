"""Find a ``docker`` client that builds with BuildKit.

The Dockerfile needs BuildKit (``RUN --mount`` for the wheelhouse, the CA secret and a tmpfs).
Two kinds of client provide it: any client with the buildx plugin (``docker buildx build
--load``), and a client older than Docker 23, whose built-in BuildKit is switched on with
``DOCKER_BUILDKIT=1`` (Debian bookworm's ``docker.io`` 20.10). A client of 23 or newer without
buildx only has the legacy builder, which cannot build this Dockerfile. Several clients may be on
``PATH`` (a newer one installed by hand in front of the distribution's); each is tried in
``PATH`` order.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lensemble.errors import ToolMissing

Run = Callable[..., "subprocess.CompletedProcess[str]"]

#: Seconds a client probe (``version``, ``buildx version``) may take.
PROBE_TIMEOUT_S = 30.0
#: The first Docker release whose ``docker build`` needs the buildx plugin for BuildKit.
FIRST_BUILDX_ONLY_MAJOR = 23


@dataclass(frozen=True)
class BuildClient:
    """How to run a BuildKit build.

    Attributes:
        docker: Absolute path of the ``docker`` executable (also used for ``image inspect``).
        build: The build command before its options (``[docker, "buildx", "build", "--load"]``
            or ``[docker, "build"]``).
        env: Extra environment variables for the build (``DOCKER_BUILDKIT=1``).
    """

    docker: str
    build: list[str]
    env: dict[str, str] = field(default_factory=dict)


def docker_executables(path: str | None = None) -> Iterator[str]:
    """Every distinct ``docker`` executable on ``PATH``, in ``PATH`` order."""
    seen: set[str] = set()
    for folder in (path if path is not None else os.environ.get("PATH", "")).split(os.pathsep):
        candidate = Path(folder or ".") / "docker"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            real = str(candidate.resolve())
            if real not in seen:
                seen.add(real)
                yield str(candidate)


def _ok(run: Run, *args: str) -> subprocess.CompletedProcess[str] | None:
    try:
        done = run(list(args), capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done if done.returncode == 0 else None


def client_major(version: str) -> int | None:
    """Major version of a client version string (``20.10.24+dfsg1`` -> 20), None if unknown."""
    head = version.strip().split(".", 1)[0]
    return int(head) if head.isdigit() else None


def probe_client(docker: str, run: Run = subprocess.run) -> BuildClient | None:
    """The BuildKit build command of one ``docker`` executable, None if it has none."""
    if _ok(run, docker, "buildx", "version") is not None:
        return BuildClient(docker=docker, build=[docker, "buildx", "build", "--load"])
    version = _ok(run, docker, "version", "--format", "{{.Client.Version}}")
    major = client_major(version.stdout) if version is not None else None
    if major is not None and major < FIRST_BUILDX_ONLY_MAJOR:
        return BuildClient(docker=docker, build=[docker, "build"], env={"DOCKER_BUILDKIT": "1"})
    return None


def find_build_client(
    docker: str | None = None, *, run: Run = subprocess.run, path: str | None = None
) -> BuildClient:
    """The first ``docker`` client (or the given one) that can build with BuildKit.

    Args:
        docker: A specific ``docker`` executable (``--docker``); None searches ``PATH``.
        run: ``subprocess.run`` or a stand-in.
        path: The search path; None uses ``PATH``.

    Raises:
        ToolMissing: No ``docker`` client, or none that can drive BuildKit.
    """
    candidates = [docker] if docker else list(docker_executables(path))
    if not candidates:
        raise ToolMissing(
            "The `docker` command is not installed.",
            remediation="Install Docker (Debian: `apt-get install docker.io`).",
        )
    for candidate in candidates:
        client = probe_client(candidate, run)
        if client is not None:
            return client
    tried = ", ".join(candidates)
    raise ToolMissing(
        f"No docker client here can build with BuildKit ({tried}: no buildx plugin, and "
        "Docker 23 or newer).",
        remediation="Install the buildx plugin (Debian: `apt-get install docker-buildx`), or "
        "pass --docker with a client that has it (Debian bookworm's docker.io client has "
        "BuildKit built in).",
    )


def image_size(docker: str, tag: str, run: Run = subprocess.run) -> int:
    """Size in bytes of a local image (``docker image inspect``), 0 if it cannot be read."""
    done = _ok(run, docker, "image", "inspect", "--format", "{{.Size}}", tag)
    text = done.stdout.strip() if done is not None else ""
    return int(text) if text.isdigit() else 0
