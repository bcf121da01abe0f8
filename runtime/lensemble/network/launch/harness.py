"""What every network process runs beside its role: ready line, logs, health, metrics, signals.

:class:`ProcessHarness` reserves stdout for the ready line, sends logs to stderr, serves the
plaintext gRPC health service and the Prometheus endpoint, and handles ``SIGTERM``/``SIGINT``.
The role's work runs in a worker thread while the main thread supervises it, so a signal never
interrupts our code halfway through a lock or a file write: the handler only sets a flag, and the
main thread then asks the worker to stop and waits a bounded time.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar

from lensemble.config import LensembleConfig, config_hash
from lensemble.network.shared import logs
from lensemble.network.shared.certs import check_tls_files
from lensemble.network.shared.file_limits import FileLimit, raise_open_file_limit
from lensemble.network.shared.health import HealthServer
from lensemble.network.shared.logs import event
from lensemble.network.shared.metrics import Metrics
from lensemble.network.shared.metrics_server import MetricsServer
from lensemble.network.shared.ready_announce import StdoutGuard, ready_line
from lensemble.network.shared.transport_errors import ShutdownRequested

T = TypeVar("T")

_log = logging.getLogger("lensemble.network.process")


@dataclass(frozen=True)
class PortOptions:
    """Port overrides from the command line (None: take the config's).

    Attributes:
        port: The coordinator's gRPC port (0 picks a free one).
        health_port: The health service port (0 picks a free one).
        metrics_port: The metrics port (0 picks a free one).
    """

    port: int | None = None
    health_port: int | None = None
    metrics_port: int | None = None


class ProcessHarness:
    """Stdout guard, logs, health, metrics and signal handling of one process.

    Args:
        config: The run's config.
        role: ``coordinator`` or ``participant``.
        participant_id: The participant's id (participants only).
        ports: Command-line port overrides.

    Attributes:
        file_limit: The open-file limit, raised to its hard ceiling at start.
    """

    def __init__(
        self,
        config: LensembleConfig,
        role: str,
        participant_id: str | None,
        ports: PortOptions,
    ) -> None:
        self.config = config
        self.role = role
        self.participant_id = participant_id
        self.stdout = StdoutGuard()
        self.stdout.claim()
        logs.configure(config, role, participant_id)
        self.stop = threading.Event()
        self._previous: dict[int, Any] = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._on_signal)
        # Before any server accepts: every connection is a descriptor (file_limits.py).
        self.file_limit: FileLimit = raise_open_file_limit()
        net = config.network
        self.metrics = Metrics()
        self.health = HealthServer(
            net.listen_host,
            net.health_port if ports.health_port is None else ports.health_port,
            handshake_timeout_s=net.handshake_timeout_s,
            idle_s=net.max_connection_idle_s,
        )
        try:
            self.metrics_server = MetricsServer(
                self.metrics.registry,
                net.listen_host,
                net.metrics_port if ports.metrics_port is None else ports.metrics_port,
                config.observability.metrics_path,
            )
        except BaseException:
            self.health.stop()
            raise

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only a flag: the main thread reacts between two waits, never inside our locks.
        self.stop.set()

    def announce_ready(self, endpoint: str, download_port: int | None = None) -> None:
        """Print the ready line (once) and mark the process ready.

        Args:
            endpoint: ``host:port`` the coordinator listens on, or the one a participant dials.
            download_port: The model download port served or used (None: FetchModel only).
        """
        if self.stdout.emitted:
            return
        self.stdout.emit(
            ready_line(
                role=self.role,
                participant_id=self.participant_id,
                endpoint=endpoint,
                config_hash=config_hash(self.config),
                health_port=self.health.port,
                metrics_port=self.metrics_server.port,
                download_port=download_port,
            )
        )

    def supervise(self, work: Callable[[], T], on_stop: Callable[[], None], grace_s: float) -> T:
        """Run ``work`` in a worker thread until it returns, raises, or a signal stops it.

        Args:
            work: The role's main loop.
            on_stop: Called once from this (main) thread after SIGTERM/SIGINT.
            grace_s: Longest wait (seconds) for ``work`` to end after ``on_stop``.

        Returns:
            What ``work`` returned.

        Raises:
            ShutdownRequested: A signal stopped the process.
            Exception: Whatever ``work`` raised.
        """
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["result"] = work()
            except BaseException as exc:  # handed to the main thread
                box["error"] = exc

        worker = threading.Thread(target=target, name=f"{self.role}-loop", daemon=True)
        worker.start()
        stopping_until: float | None = None
        while worker.is_alive():
            worker.join(0.2)
            if self.stop.is_set() and stopping_until is None:
                event(_log, "stopping", f"signal received; stopping within {grace_s:.0f} s.")
                stopping_until = time.monotonic() + grace_s
                on_stop()
            if stopping_until is not None and time.monotonic() > stopping_until:
                raise ShutdownRequested(f"the {self.role} stopped (signal) while still busy;")
        if "error" in box:
            raise box["error"]
        return box["result"]  # type: ignore[no-any-return]

    def linger(self) -> None:
        """After a finished run, keep serving health and metrics until SIGTERM/SIGINT.

        Under a Kubernetes Deployment or StatefulSet (restartPolicy Always) a process that
        exits after the last round is restarted in a loop; ``LENSEMBLE_LINGER`` keeps it idle
        instead, so the pod stays live and the final model stays available.
        """
        event(_log, "lingering", "run finished; idling until SIGTERM (LENSEMBLE_LINGER).")
        while not self.stop.wait(1.0):
            pass

    def close(self) -> None:
        """Stop health and metrics servers and restore the signal handlers."""
        self.health.stop()
        self.metrics_server.stop()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def check_certificates(config: LensembleConfig, identity: str) -> None:
    """Refuse an expired own certificate or CA at start; warn when one expires soon.

    Raises:
        ConfigError: A certificate or CA of ``identity`` has expired, is not valid yet or
            cannot be read.
    """
    for warning in check_tls_files(config, identity):
        event(_log, "certificate_expiring", warning, logging.WARNING)
