"""The ready line: exactly one JSON line on stdout, before anything else on stdout.

:class:`StdoutGuard` takes the process's stdout away from everything else when a process
starts: file descriptor 1 is pointed at stderr, so a stray ``print`` (ours or a library's, Python
or C) lands in the logs and can never precede or follow the ready line. The ready line goes to the
saved original stdout, which is then closed: a reader sees one line and end of file.

Format (``docs/architecture.md``, "Start-up and shutdown")::

    {"event": "ready", "role": "participant", "participant_id": "alpine",
     "endpoint": "127.0.0.1:50051", "config_hash": "sha256-canon-v1:...", "version": "0.1.0",
     "health_port": 50052, "metrics_port": 9090, "download_port": 50053, "pid": 1234}
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from lensemble import __version__


def ready_line(
    *,
    role: str,
    participant_id: str | None,
    endpoint: str,
    config_hash: str,
    health_port: int,
    metrics_port: int,
    download_port: int | None = None,
) -> str:
    """The ready line's JSON text (no newline).

    Args:
        role: ``coordinator`` or ``participant``.
        participant_id: The participant's id, None for the coordinator.
        endpoint: ``host:port`` the coordinator listens on, or the one a participant dials.
        config_hash: The process's config hash.
        health_port: Port of its gRPC health service.
        metrics_port: Port of its Prometheus endpoint.
        download_port: The model download port: the one the coordinator serves, or the one a
            participant fetches from (on the coordinator's host); None when models go over
            gRPC FetchModel only (``network.download_port: null``).
    """
    fields: dict[str, Any] = {
        "event": "ready",
        "role": role,
        "participant_id": participant_id,
        "endpoint": endpoint,
        "config_hash": config_hash,
        "version": __version__,
        "health_port": health_port,
        "metrics_port": metrics_port,
        "download_port": download_port,
        "pid": os.getpid(),
    }
    return json.dumps(fields, separators=(", ", ": "))


class StdoutGuard:
    """Reserve stdout for the ready line.

    Call :meth:`claim` first thing in a process; :meth:`emit` writes the line once and closes
    the reserved descriptor.
    """

    def __init__(self) -> None:
        self._fd: int | None = None
        self.emitted = False

    def claim(self) -> None:
        """Save the real stdout and point descriptor 1 (and ``sys.stdout``) at stderr."""
        sys.stdout.flush()
        self._fd = os.dup(1)
        os.dup2(2, 1)

    def emit(self, line: str) -> None:
        """Write the ready line (once) to the saved stdout and close it.

        Raises:
            RuntimeError: Called twice (a bug: the contract is exactly one line).
        """
        if self.emitted:
            raise RuntimeError("the ready line was already written")
        self.emitted = True
        data = (line + "\n").encode()
        if self._fd is None:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
            return
        try:
            os.write(self._fd, data)
        finally:
            os.close(self._fd)
            self._fd = None
