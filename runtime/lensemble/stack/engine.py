"""The container engine seen by ``lensemble up``/``down``: a protocol and its Docker version.

:class:`Engine` is everything the orchestration in :mod:`lensemble.stack.compose_stack` needs
from a container engine, so it can be tested with a fake one. :class:`DockerComposeEngine`
drives Docker Compose (v2 ``docker compose`` or the standalone ``docker-compose``) for the
project, and the ``docker`` CLI for per-container logs and state.
"""

from __future__ import annotations

import io
import math
import os
import shutil
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from lensemble.errors import ToolMissing
from lensemble.stack import StackFailed

Run = Callable[..., "subprocess.CompletedProcess[str]"]

#: Seconds a single engine query (ps, inspect, logs without follow) may take.
QUERY_TIMEOUT_S = 60.0
#: Seconds ``down`` may take (stopping waits for each container's grace period).
COMPOSE_TIMEOUT_S = 1800.0
#: Seconds between two progress lines while a long engine step runs.
PROGRESS_EVERY_S = 15.0
#: Largest file :meth:`Engine.read_file` copies out of a container (bytes).
MAX_READ_BYTES = 256 * 2**20

Echo = Callable[[str], None]


@dataclass(frozen=True)
class ContainerState:
    """State of one container as the engine reports it.

    Attributes:
        status: ``created``, ``running``, ``restarting``, ``paused``, ``exited`` or ``dead``.
        exit_code: Exit code of the last run (0 while it has not exited).
        health: ``starting``, ``healthy`` or ``unhealthy``; empty without a healthcheck.
        restarts: How often the restart policy restarted the container.
    """

    status: str
    exit_code: int
    health: str = ""
    restarts: int = 0

    @property
    def finished(self) -> bool:
        """True when the container stopped and its restart policy will not start it again."""
        return self.status in ("exited", "dead")


class Engine(Protocol):
    """The operations ``lensemble up`` and ``down`` need on one Compose project."""

    def create(self, *, timeout_s: float, echo: Echo) -> None:
        """Create the project's networks, volumes and containers without starting them.

        Raises:
            StackFailed: Not done within ``timeout_s`` seconds (the message names the step).
        """

    def start(self, *, timeout_s: float, echo: Echo) -> None:
        """Start the created containers in dependency order, in the background.

        Raises:
            StackFailed: Not done within ``timeout_s`` seconds (the message names the step).
        """

    def image_present(self, image: str) -> bool:
        """True when the engine holds ``image`` locally."""

    def read_file(self, container: str, path: str) -> bytes | None:
        """The bytes of one file in a (running or stopped) container, None if it has none."""

    def down(self, *, volumes: bool) -> None:
        """Stop and remove the project's containers and networks (and volumes if asked)."""

    def container(self, service: str) -> str | None:
        """Id of the service's container, None while it has none."""

    def stdout(self, container: str) -> str:
        """Everything the container wrote to stdout so far."""

    def state(self, container: str) -> ContainerState:
        """Current state of the container."""

    def follow(self, container: str, *, new_only: bool) -> Iterator[str]:
        """Log lines (stdout and stderr) until the container stops.

        Args:
            container: Container id.
            new_only: Skip lines written before the call (used when following again after a
                restart, so nothing is shown twice).
        """


def compose_command(run: Run = subprocess.run) -> list[str]:
    """The Compose command to use: ``docker compose`` (v2) if present, else ``docker-compose``.

    Raises:
        ToolMissing: Neither is installed.
    """
    if shutil.which("docker"):
        try:
            probe = run(
                ["docker", "compose", "version"],
                capture_output=True,
                text=True,
                timeout=QUERY_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            probe = None
        if probe is not None and probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise ToolMissing(
        "Neither `docker compose` (v2) nor `docker-compose` is installed.",
        remediation="Install Docker with its Compose plugin (https://docs.docker.com/compose/).",
    )


def check_engine(run: Run = subprocess.run) -> None:
    """Make sure a Docker engine answers (``docker info``).

    Raises:
        ToolMissing: The ``docker`` CLI is missing or no engine is reachable.
    """
    try:
        done = run(
            ["docker", "info"], capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, check=False
        )
    except FileNotFoundError:
        raise ToolMissing(
            "The `docker` command is not installed.",
            remediation="Install Docker (https://docs.docker.com/engine/install/).",
        ) from None
    except subprocess.TimeoutExpired:
        done = None
    if done is None or done.returncode != 0:
        reason = _last_line(done.stderr) if done is not None else "it did not answer"
        raise ToolMissing(
            f"No Docker engine is reachable (`docker info`: {reason}).",
            remediation="Start Docker, or point DOCKER_HOST at a running engine.",
        )


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


class DockerComposeEngine:
    """One Compose project driven through the Compose and ``docker`` command-line tools.

    Args:
        command: The Compose command (see :func:`compose_command`).
        project: Compose project name (``-p``).
        compose_file: The rendered Compose file.
        profile: The profile to start (``cpu`` or ``gpu``).
        run: ``subprocess.run`` or a stand-in.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        project: str,
        compose_file: Path,
        profile: str,
        run: Run = subprocess.run,
    ) -> None:
        self.command = list(command)
        self.project = project
        self.compose_file = compose_file
        self.profile = profile
        self._run = run

    def _compose_args(self, *args: str) -> list[str]:
        return [
            *self.command,
            "-p",
            self.project,
            "-f",
            str(self.compose_file),
            "--profile",
            self.profile,
            *args,
        ]

    def _call(
        self,
        args: list[str],
        *,
        what: str,
        timeout: float,
        env: dict[str, str] | None = None,
        slow: str = "Check that the Docker engine is responsive (`docker info`).",
    ) -> str:
        """Run one command; its stdout, or StackFailed/ToolMissing naming ``what`` failed."""
        try:
            done = self._run(
                args, capture_output=True, text=True, timeout=timeout, check=False, env=env
            )
        except FileNotFoundError:
            raise ToolMissing(
                f"`{args[0]}` is not installed, so cannot {what}.",
                remediation="Install Docker (https://docs.docker.com/engine/install/).",
            ) from None
        except subprocess.TimeoutExpired:
            raise StackFailed(
                f"`{' '.join(args[:4])} ...` did not finish within {timeout:.0f} s ({what}).",
                remediation=slow,
            ) from None
        if done.returncode != 0:
            raise StackFailed(
                f"Could not {what}: {_last_line(done.stderr or done.stdout)}",
                remediation=f"Command: {' '.join(args)}",
            )
        return done.stdout

    def _step(self, args: list[str], *, what: str, timeout_s: float, echo: Echo) -> None:
        """Run one long Compose step under our own deadline, with a progress line now and then.

        docker-compose 1.x gives up on any engine call slower than ``COMPOSE_HTTP_TIMEOUT``
        (60 s by default), which a slow storage driver exceeds while it creates containers; the
        step's own deadline is passed as that timeout so only our deadline applies.
        """
        env = {**os.environ, "COMPOSE_HTTP_TIMEOUT": str(math.ceil(timeout_s))}
        finished = threading.Event()
        start = time.monotonic()

        def tick() -> None:
            while not finished.wait(PROGRESS_EVERY_S):
                echo(f"  still working: {what} ({time.monotonic() - start:.0f} s)")

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            self._call(
                args,
                what=what,
                timeout=timeout_s,
                env=env,
                slow="The engine is slow (a vfs storage driver copies the whole image for every "
                "container); give it longer with --start-timeout, or run dockerd with overlay2.",
            )
        finally:
            finished.set()
            ticker.join()

    def create(self, *, timeout_s: float, echo: Echo) -> None:
        """``up --no-start``: networks, volumes and containers, nothing started."""
        self._step(
            self._compose_args("up", "--no-start"),
            what=f"create the containers of the Compose project '{self.project}'",
            timeout_s=timeout_s,
            echo=echo,
        )

    def start(self, *, timeout_s: float, echo: Echo) -> None:
        """``up -d`` on the created project: starts in dependency order (healthy coordinator)."""
        self._step(
            self._compose_args("up", "-d"),
            what=f"start the Compose project '{self.project}'",
            timeout_s=timeout_s,
            echo=echo,
        )

    def image_present(self, image: str) -> bool:
        """``docker image inspect`` succeeds."""
        try:
            done = self._run(
                ["docker", "image", "inspect", image],
                capture_output=True,
                text=True,
                timeout=QUERY_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0

    def read_file(self, container: str, path: str) -> bytes | None:
        """``docker cp CONTAINER:PATH -``: one regular file out of the tar stream, bounded."""
        try:
            done = subprocess.run(
                ["docker", "cp", f"{container}:{path}", "-"],
                capture_output=True,
                timeout=QUERY_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode != 0 or len(done.stdout) > MAX_READ_BYTES + 2**20:
            return None
        try:
            with tarfile.open(fileobj=io.BytesIO(done.stdout), mode="r:") as tar:
                member = next((m for m in tar if m.isfile()), None)
                if member is None or member.size > MAX_READ_BYTES:
                    return None
                handle = tar.extractfile(member)
                return handle.read() if handle is not None else None
        except tarfile.TarError:
            return None

    def down(self, *, volumes: bool) -> None:
        """Remove the stack's containers and networks; its volumes too when ``volumes``.

        The ``monitoring`` profile is named too: a Prometheus started beside the stack shares
        its networks, which could not be removed while it runs.
        """
        args = self._compose_args(
            "--profile",
            "monitoring",
            "down",
            "--remove-orphans",
            *(["--volumes"] if volumes else []),
        )
        self._call(
            args, what=f"tear down the Compose project '{self.project}'", timeout=COMPOSE_TIMEOUT_S
        )

    def container(self, service: str) -> str | None:
        """Container id of ``service`` (stopped containers included)."""
        out = self._call(
            self._compose_args("ps", "-a", "-q", service),
            what=f"find the container of {service}",
            timeout=QUERY_TIMEOUT_S,
        )
        ids = out.split()
        return ids[0] if ids else None

    def stdout(self, container: str) -> str:
        """The container's stdout so far (``docker logs`` keeps stderr apart)."""
        return self._call(
            ["docker", "logs", container],
            what=f"read the output of container {container[:12]}",
            timeout=QUERY_TIMEOUT_S,
        )

    def state(self, container: str) -> ContainerState:
        """Status, exit code, health and restarts from ``docker inspect``."""
        template = (
            "{{.State.Status}} {{.State.ExitCode}} {{.RestartCount}} "
            "{{if .State.Health}}{{.State.Health.Status}}{{end}}"
        )
        out = self._call(
            ["docker", "inspect", "--format", template, container],
            what=f"inspect container {container[:12]}",
            timeout=QUERY_TIMEOUT_S,
        )
        fields = out.split()
        numbers = [int(f) if f.lstrip("-").isdigit() else 0 for f in fields[1:3]] + [0, 0]
        return ContainerState(
            status=fields[0] if fields else "unknown",
            exit_code=numbers[0],
            restarts=numbers[1],
            health=fields[3] if len(fields) > 3 else "",
        )

    def follow(self, container: str, *, new_only: bool) -> Iterator[str]:
        """Stream ``docker logs -f`` (stdout and stderr merged) until the container stops."""
        args = ["docker", "logs", "--follow", *(["--tail", "0"] if new_only else []), container]
        with subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as proc:
            assert proc.stdout is not None  # guaranteed by stdout=PIPE
            try:
                for line in proc.stdout:
                    yield line.rstrip("\n")
            finally:
                if proc.poll() is None:
                    proc.terminate()
                proc.wait()
