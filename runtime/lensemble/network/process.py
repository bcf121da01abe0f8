"""The coordinator and participant processes: servers, ready line, signals, shutdown.

Both roles share :class:`ProcessHarness`: stdout reserved for the ready line, logs on stderr,
the plaintext gRPC health service, the Prometheus endpoint, and ``SIGTERM``/``SIGINT`` handling.
The role's work runs in a worker thread while the main thread supervises it, so a signal never
interrupts our code halfway through a lock or a file write: the handler only sets a flag, and the
main thread then asks the worker to stop and waits a bounded time.

- Coordinator: resumes from the last checkpoint in ``run.output_dir`` when there is one, serves
  ``lensemble.v1.Coordinator``, and runs the unchanged federation ``Coordinator`` over
  :class:`~lensemble.network.coordinator_transport.GrpcCoordinatorTransport`. On SIGTERM the
  open round is abandoned (nothing committed; the last checkpoint stands and a restart reopens
  the round).
- Participant: joins, then takes part in rounds
  (:class:`~lensemble.network.participant_client.ParticipantLoop`); on SIGTERM it leaves.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import torch

from lensemble.config import LensembleConfig, config_hash
from lensemble.errors import UsageError
from lensemble.federation.coordinator import Coordinator, RunSummary, global_architecture
from lensemble.federation.faults import FaultPlan
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.messages import Submission, Verdict
from lensemble.federation.participant import Participant
from lensemble.federation.rounds import RoundState
from lensemble.federation.signing import signer_from_env
from lensemble.federation.verify import VerifiedRecord, require_valid
from lensemble.learner import Learner
from lensemble.network import logs
from lensemble.network.certs import check_own_certificate, check_tls_files
from lensemble.network.coordinator_transport import GrpcCoordinatorTransport
from lensemble.network.health import HealthServer
from lensemble.network.identity import COORDINATOR_IDENTITY, identity_path
from lensemble.network.logs import event
from lensemble.network.metrics import Metrics, MetricsServer
from lensemble.network.model_download import start_model_download
from lensemble.network.participant_client import CoordinatorClient, ParticipantLoop
from lensemble.network.payload_limits import payload_limits
from lensemble.network.peer_text import shown
from lensemble.network.ready_announce import StdoutGuard, ready_line
from lensemble.network.security import (
    Authenticator,
    coordinator_tokens,
    participant_token,
    server_credentials,
    warn_if_insecure,
)
from lensemble.network.service import start_coordinator_server
from lensemble.network.transport_errors import ShutdownRequested
from lensemble.run_lock import coordinator_lock

T = TypeVar("T")

#: ``theta_0`` (name -> tensor), or a function that builds it (see :func:`run_coordinator`).
InitialParams = Mapping[str, torch.Tensor] | Callable[[], Mapping[str, torch.Tensor]]

_log = logging.getLogger("lensemble.network.process")

#: Longest wait for a participant's worker to notice a stop before the process exits (seconds).
PARTICIPANT_STOP_GRACE_S = 5.0
#: Torch intra-op threads of the coordinator process. Its tensor work (validation, reduction,
#: outer step, hashing) is element-wise and memory-bound, while its gRPC threads need the cores
#: for TLS and streaming: OpenMP workers spinning between small ops cost more than they save
#: (bench/network_transport.py table 0: a 1M round took 0.6 s with torch's default threads
#: on 2 shared cores, 0.34 s with one).
COORDINATOR_TORCH_THREADS = 1


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
        net = config.network
        self.metrics = Metrics()
        self.health = HealthServer(
            net.listen_host, net.health_port if ports.health_port is None else ports.health_port
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

    def announce_ready(self, endpoint: str) -> None:
        """Print the ready line (once) and mark the process ready."""
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


class CoordinatorEvents:
    """Coordinator observer: structured log events and metrics."""

    def __init__(self, metrics: Metrics, quorum: int) -> None:
        self.metrics = metrics
        self.quorum = quorum
        self._log = logging.getLogger("lensemble.network.rounds")

    def on_state(self, round_index: int, attempt: int, state: RoundState) -> None:
        """Track the round state machine (and time the attempt from its opening)."""
        if state == RoundState.OPEN:
            self.metrics.attempt_starting()
        self.metrics.round_state.state(state.value)

    def on_verdict(self, submission: Submission, verdict: Verdict) -> None:
        """Count and log each judged update."""
        self.metrics.verdict(verdict.accepted, verdict.reason.value)
        event(
            self._log,
            "verdict",
            f"round {submission.round_index}: {submission.sender} {verdict.reason.value}"
            + ("" if verdict.accepted else f" ({shown(verdict.message)})"),
            logging.INFO if verdict.accepted else logging.WARNING,
            round=submission.round_index,
            participant=submission.sender,
            reason=verdict.reason.value,
            bytes=len(submission.payload),
        )

    def on_round(self, record: RoundRecord) -> None:
        """Log each closed or aborted attempt with its lineage."""
        what = (
            f"committed {record.model_hash[:19]}..."
            if record.state == "closed"
            else f"aborted ({len(record.contributors)} of {self.quorum} required contributors)"
        )
        event(
            self._log,
            "round_closed",
            f"round {record.round} attempt {record.attempt} {what}; contributors "
            f"{', '.join(record.contributors) or 'none'}"
            + (f"; excluded {record.excluded}" if record.excluded else ""),
            round=record.round,
            attempt=record.attempt,
            state=record.state,
            contributors=record.contributors,
            excluded=record.excluded,
            model_hash=record.model_hash,
            bytes_up=record.bytes_up,
            bytes_down=record.bytes_down,
            wall_s=record.wall_s,
            non_compute_s=record.non_compute_s,
        )


def _check_certificates(config: LensembleConfig, identity: str) -> None:
    """Refuse an expired own certificate or CA at start; warn when one expires soon."""
    for warning in check_tls_files(config, identity):
        event(_log, "certificate_expiring", warning, logging.WARNING)


def run_coordinator(
    config: LensembleConfig,
    initial_params: InitialParams,
    ports: PortOptions | None = None,
    *,
    linger: bool = False,
) -> RunSummary:
    """The coordinator process: serve, run every round, let participants leave.

    Args:
        config: The run's config.
        initial_params: ``theta_0`` (used only when ``run.output_dir`` has no checkpoint), or
            a function that builds it. Pass the function: the coordinator copies ``theta_0``
            into its own buffer, and a mapping the caller passes stays alive for the whole
            run (one more model's worth of memory: 400 MB at 100M float32 parameters).
        ports: Port overrides.
        linger: After the last round, keep serving (health, final model) until a signal.

    Returns:
        The run's summary once every round is committed.

    Raises:
        FolderLocked: Another coordinator writes ``run.output_dir`` (exit 2, at once).
        IntegrityError: The run record to resume from is broken (exit 3, before any I/O).
        UsageError: The run record is signed and no key is configured (exit 2, before any I/O).
        ShutdownRequested: SIGTERM/SIGINT (the last checkpoint stands).
        QuorumNotReached: Too few participants joined, or a round stayed below quorum.
        ConfigError: TLS files or tokens are missing, a certificate expired, or the checkpoint
            has another config.
    """
    ports = ports or PortOptions()
    # One writer per run folder, and the run record verified before any network I/O.
    lock = coordinator_lock(Path(config.run.output_dir)).acquire()
    try:
        verified = require_valid(
            Path(config.run.output_dir), config.observability.ledger_path, signer_from_env()
        )
        return _serve_coordinator(config, initial_params, ports, linger=linger, verified=verified)
    finally:
        lock.release()


def _serve_coordinator(
    config: LensembleConfig,
    initial_params: InitialParams,
    ports: PortOptions,
    *,
    linger: bool,
    verified: VerifiedRecord,
) -> RunSummary:
    harness = ProcessHarness(config, "coordinator", None, ports)
    server = download = None
    torch.set_num_threads(COORDINATOR_TORCH_THREADS)
    try:
        warn_if_insecure(config)
        _check_certificates(config, COORDINATOR_IDENTITY)
        fed, net = config.federation, config.network
        theta0 = initial_params() if callable(initial_params) else initial_params
        del initial_params
        # Refuses a network.max_message_bytes below the model's wire size before any write.
        payload_limits(config, global_architecture(theta0))
        coordinator = Coordinator(
            config,
            theta0,
            output_dir=Path(config.run.output_dir),
            resume=verified,
            observer=CoordinatorEvents(harness.metrics, fed.quorum),
        )
        del theta0  # the coordinator holds its own copy; a built theta_0 goes now
        if coordinator.version > 0:
            event(
                _log,
                "resumed",
                f"resumed from the checkpoint of model version {coordinator.version} "
                f"({coordinator.model_hash[:19]}...), outer momentum included.",
                version=coordinator.version,
                model_hash=coordinator.model_hash,
            )
        transport = GrpcCoordinatorTransport(
            config, next_round=coordinator.version, metrics=harness.metrics
        )
        authenticator = Authenticator(config, config.participant_ids, coordinator_tokens(config))
        server, port = start_coordinator_server(
            transport,
            authenticator,
            server_credentials(config),
            host=net.listen_host,
            port=net.port if ports.port is None else ports.port,
            architecture=coordinator.architecture,
        )
        download = start_model_download(transport, authenticator, config, port=net.download_port)
        harness.health.set_ready(True)
        harness.announce_ready(f"{net.listen_host}:{port}")
        summary = harness.supervise(
            lambda: coordinator.run(transport), transport.request_stop, net.rpc_timeout_s
        )
        # Let watchers see the final announcement and leave (bounded).
        transport.wait_all_left(net.rpc_timeout_s)
        event(
            _log,
            "finished",
            f"run finished at model version {summary.version}: {summary.model_hash}",
            version=summary.version,
            model_hash=summary.model_hash,
        )
        if linger:
            harness.linger()
        return summary
    finally:
        harness.health.set_ready(False)
        if download is not None:
            download.stop()
        if server is not None:
            server.stop(grace=1.0).wait(2.0)
        harness.close()


def run_participant(
    config: LensembleConfig,
    participant_id: str,
    learner_factory: Callable[[], Learner],
    initial_params: InitialParams,
    ports: PortOptions | None = None,
    *,
    linger: bool = False,
    faults: FaultPlan | None = None,
) -> list[tuple[int, int]]:
    """The participant process: join, take part in every round, leave.

    Args:
        config: The run's config.
        participant_id: This participant (already resolved, see ``identity``).
        learner_factory: Builds the learner (loads or collects this participant's private data).
        initial_params: ``theta_0``, or a function that builds it: gives the architecture
            every model must have, and nothing else (a built one is dropped at once).
        ports: Health and metrics port overrides.
        linger: After the run is over, keep serving health until a signal.
        faults: Faults to inject into this participant (``rank_kill`` entries naming it;
            others are ignored), as ``lensemble simulate --faults`` does in process.

    Returns:
        ``(round, attempt)`` of every accepted contribution.

    Raises:
        ShutdownRequested: SIGTERM/SIGINT.
        UsageError: ``faults`` kills a rank of a participant whose learner has no ranks.
        ConfigError: Config mismatch with the coordinator, TLS/token files missing, or a
            certificate expired.
        AccessDenied: The coordinator refused this participant's credentials.
        CoordinatorUnreachable: No coordinator within ``federation.join_timeout_s``.
        CertificateRejected: The TLS handshake failed on a certificate (not retried).
        ResidencyViolation: The learner tried to release data (fails closed).
    """
    ports = ports or PortOptions()
    harness = ProcessHarness(config, "participant", participant_id, ports)
    client = None
    try:
        warn_if_insecure(config)
        _check_certificates(config, participant_id)
        tls = config.network.tls
        if tls.enabled and tls.client_auth and tls.cert_file:
            check_own_certificate(
                Path(str(identity_path(tls.cert_file, participant_id))), participant_id
            )
        token = participant_token(config, participant_id)
        theta0 = initial_params() if callable(initial_params) else initial_params
        del initial_params
        architecture = global_architecture(theta0)
        del theta0  # only its names and shapes are needed: a model's worth of memory goes
        # Refuses a network.max_message_bytes below the model's wire size before any work.
        payload_limits(config, architecture)
        learner = learner_factory()
        own = (faults or FaultPlan()).of_participant(participant_id)
        if own.faults and not callable(getattr(learner, "arm_rank_kill", None)):
            raise UsageError(
                f"--faults {own.faults[0].spec()} kills a rank of '{participant_id}', which runs "
                "as one process;",
                remediation="give it several ranks (federation.participants[i].ranks) or drop "
                "the fault.",
            )
        participant = Participant(
            config, participant_id, learner, architecture, Path(config.run.output_dir)
        )
        client = CoordinatorClient(
            config,
            participant_id,
            token=token,
            metrics=harness.metrics,
            architecture=architecture,
        )

        def on_ready(ready: bool) -> None:
            harness.health.set_ready(ready)
            if ready:
                harness.announce_ready(client.target)

        loop = ParticipantLoop(
            config, participant, client, stop=harness.stop, on_ready=on_ready, faults=own
        )

        def leave() -> None:
            client.leave("shutting down (signal)")

        harness.supervise(loop.run, leave, PARTICIPANT_STOP_GRACE_S)
        if linger:
            harness.linger()
        return loop.rounds_contributed
    finally:
        if client is not None:
            client.close()
        harness.close()
