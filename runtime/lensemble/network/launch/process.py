"""The coordinator and participant processes: servers, ready line, signals, shutdown.

Both roles run in a :class:`~lensemble.network.launch.harness.ProcessHarness` (ready line,
logs, health, metrics, signals).

- Coordinator: resumes from the last checkpoint in ``run.output_dir`` when there is one, serves
  ``lensemble.v1.Coordinator``, and runs the unchanged federation ``Coordinator`` over
  :class:`~lensemble.network.coordinator.transport.GrpcCoordinatorTransport`. On SIGTERM the
  open round is abandoned (nothing committed; the last checkpoint stands and a restart reopens
  the round).
- Participant: joins, then takes part in rounds
  (:class:`~lensemble.network.participant.loop.ParticipantLoop`); on SIGTERM it leaves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from lensemble.config import LensembleConfig
from lensemble.errors import UsageError
from lensemble.federation.coordinator import Coordinator, RunSummary, global_architecture
from lensemble.federation.faults import FaultPlan
from lensemble.federation.guard import summary as divergence_summary
from lensemble.federation.participant import Participant
from lensemble.federation.payload import TensorSpec
from lensemble.federation.signing import signer_from_env
from lensemble.federation.verify import VerifiedRecord, require_valid
from lensemble.learner import Learner
from lensemble.network.coordinator.authenticator import Authenticator
from lensemble.network.coordinator.connection_budget import ConnectionBudget, plan_budget
from lensemble.network.coordinator.connection_warden import ConnectionWarden
from lensemble.network.coordinator.download_server import (
    ModelDownloadServer,
    start_model_download,
)
from lensemble.network.coordinator.noise_seed import coordinator_noise_seed
from lensemble.network.coordinator.round_events import CoordinatorEvents
from lensemble.network.coordinator.round_log import RoundLog
from lensemble.network.coordinator.server import start_coordinator_server
from lensemble.network.coordinator.transport import GrpcCoordinatorTransport
from lensemble.network.launch.harness import PortOptions, ProcessHarness, check_certificates
from lensemble.network.launch.torch_threads import participant_threads
from lensemble.network.participant.client import CoordinatorClient
from lensemble.network.participant.loop import ParticipantLoop
from lensemble.network.shared.certs import check_own_certificate
from lensemble.network.shared.health import HEALTH_PER_ADDRESS
from lensemble.network.shared.identity import COORDINATOR_IDENTITY, identity_path
from lensemble.network.shared.logs import event
from lensemble.network.shared.payload_limits import payload_limits
from lensemble.network.shared.security import (
    coordinator_tokens,
    participant_token,
    server_credentials,
    warn_if_insecure,
)
from lensemble.run_lock import coordinator_lock

#: ``theta_0`` (name -> tensor), or a function that builds it (see :func:`run_coordinator`).
InitialParams = Mapping[str, torch.Tensor] | Callable[[], Mapping[str, torch.Tensor]]

_log = logging.getLogger("lensemble.network.process")

#: Longest wait for a participant's worker to notice a stop before the process exits (seconds).
PARTICIPANT_STOP_GRACE_S = 5.0
#: Torch intra-op threads of the coordinator process. Its tensor work (validation, reduction,
#: outer step, hashing) is element-wise and memory-bound, while its gRPC threads need the cores
#: for TLS and streaming: OpenMP workers spinning between small ops cost more than they save
#: (``docs/performance.md``, *The coordinator's torch threads*).
COORDINATOR_TORCH_THREADS = 1


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
    server = download = warden = None
    round_log = RoundLog()  # round events in causal order, though commits are written behind
    torch.set_num_threads(COORDINATOR_TORCH_THREADS)
    try:
        warn_if_insecure(config)
        check_certificates(config, COORDINATOR_IDENTITY)
        fed, net = config.federation, config.network
        theta0 = initial_params() if callable(initial_params) else initial_params
        del initial_params
        architecture = global_architecture(theta0)
        # Refuses a network.max_message_bytes below the model's wire size before any write.
        payload_limits(config, architecture)
        # Both ports are bound before the coordinator writes anything: a port in use fails the
        # start with the run folder as it was (no version-0 checkpoint left to resume from).
        transport = _transport(config, verified, harness, round_log)
        authenticator = Authenticator(config, config.participant_ids, coordinator_tokens(config))
        budget = _connection_budget(config, harness)
        server, port = start_coordinator_server(
            transport,
            authenticator,
            server_credentials(config),
            host=net.listen_host,
            port=net.port if ports.port is None else ports.port,
            architecture=architecture,
            budget=budget,
        )
        download = start_model_download(
            transport, authenticator, config, port=net.download_port, budget=budget
        )
        warden = _warden(budget, harness, port, download)
        coordinator = Coordinator(
            config,
            theta0,
            output_dir=Path(config.run.output_dir),
            resume=verified,
            observer=CoordinatorEvents(harness.metrics, fed.quorum, round_log),
            central_noise_seed=coordinator_noise_seed(config),  # from its own key
        )
        del theta0  # the coordinator holds its own copy; a built theta_0 goes now
        _say_if_resumed(coordinator)
        harness.health.set_ready(True)
        harness.announce_ready(
            f"{net.listen_host}:{port}", download.port if download is not None else None
        )
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
        _say_how_it_ended(coordinator, summary)
        if linger:
            harness.linger()
        return summary
    finally:
        round_log.release()  # a failed commit's successors, after the error that ended the run
        harness.health.set_ready(False)
        if warden is not None:
            warden.stop()
        if download is not None:
            download.stop()
        if server is not None:
            server.stop(grace=1.0).wait(2.0)
        harness.close()


def _transport(
    config: LensembleConfig, verified: VerifiedRecord, harness: ProcessHarness, round_log: RoundLog
) -> GrpcCoordinatorTransport:
    """The gRPC transport; the first round it opens is the newest verified checkpoint's version."""
    latest = verified.latest
    return GrpcCoordinatorTransport(
        config,
        next_round=latest.version if latest is not None else 0,
        metrics=harness.metrics,
        round_log=round_log,
    )


def _say_how_it_ended(coordinator: Coordinator, summary: RunSummary) -> None:
    """Log the guard's warning, why the run stopped early, and the model it ends with."""
    _say_if_diverged(coordinator)
    _say_if_stopped(summary.stopped)
    _say_final_model(summary)


def _say_final_model(summary: RunSummary) -> None:
    """Log the ``final_model`` event: which version the run ends with (``best_reported``)."""
    if summary.kept is not None:
        choice = summary.kept.choice
        event(_log, "final_model", choice.why, **choice.to_dict())


def _say_if_resumed(coordinator: Coordinator) -> None:
    """Log the ``resumed`` event when the coordinator starts from a checkpoint."""
    if coordinator.version > 0:
        event(
            _log,
            "resumed",
            f"resumed from the checkpoint of model version {coordinator.version} "
            f"({coordinator.model_hash[:19]}...), outer momentum included.",
            version=coordinator.version,
            model_hash=coordinator.model_hash,
        )


def _connection_budget(config: LensembleConfig, harness: ProcessHarness) -> ConnectionBudget:
    """Plan the ports' connection caps below the open-file limit, and say what they are."""
    budget = plan_budget(config)
    limit = harness.file_limit
    metrics = harness.metrics
    metrics.open_files_limit.set(limit.soft)
    for label in ("grpc", "download", "health", "metrics"):
        metrics.connection_limit.labels(port=label).set(getattr(budget, label))
    event(
        _log,
        "file_limit",
        f"open-file limit {limit.soft} (hard {limit.hard}, was {limit.before}); "
        f"{budget.reserve} descriptors kept for the coordinator's files; connections: gRPC "
        f"{budget.grpc}, model download {budget.download}, health {budget.health}, metrics "
        f"{budget.metrics}, at most {budget.per_address} per peer address.",
        soft=limit.soft,
        hard=limit.hard,
        before=limit.before,
        reserve=budget.reserve,
        grpc=budget.grpc,
        download=budget.download,
        per_address=budget.per_address,
    )
    if budget.short:
        event(
            _log,
            "file_limit_low",
            f"the open-file limit {limit.soft} is below the {budget.minimum_limit()} "
            f"descriptors {len(config.participant_ids)} participants need: a flood of "
            "connections can exhaust it; raise the hard limit (ulimit -Hn, Compose ulimits, "
            "the container runtime's default).",
            logging.WARNING,
            soft=limit.soft,
            needed=budget.minimum_limit(),
        )
    return budget


def _warden(
    budget: ConnectionBudget,
    harness: ProcessHarness,
    port: int,
    download: ModelDownloadServer | None,
) -> ConnectionWarden:
    """Start capping connections per peer address on the gRPC and health ports."""
    ports = {port: "grpc", harness.health.port: "health", harness.metrics_server.port: "metrics"}
    if download is not None:
        ports[download.port] = "download"
    caps = {port: budget.per_address, harness.health.port: HEALTH_PER_ADDRESS}
    return ConnectionWarden(ports, caps, harness.metrics).start()


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
        faults: Faults to inject into this participant (``rank_kill``, ``misreport`` and the
            estimating attacks naming it; others are ignored), as ``lensemble simulate
            --faults`` does in process.

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
    harness = ProcessHarness(config, "participant", participant_id, ports or PortOptions())
    client = None
    budget = participant_threads(config)
    torch.set_num_threads(budget.threads)
    _log.info(budget.describe())
    try:
        token = _participant_credentials(config, participant_id)
        architecture = _architecture(initial_params)
        del initial_params
        # Refuses a network.max_message_bytes below the model's wire size before any work.
        payload_limits(config, architecture)
        learner = learner_factory()
        own = _own_faults(faults, participant_id, learner)
        participant = Participant(
            config, participant_id, learner, architecture, Path(config.run.output_dir)
        )
        participant.take_faults(own)  # attacks it makes on itself, if any
        client = CoordinatorClient(
            config, participant_id, token=token, metrics=harness.metrics, architecture=architecture
        )

        def on_ready(ready: bool) -> None:
            harness.health.set_ready(ready)
            if ready:
                harness.announce_ready(client.target, client.download_port)

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


def _say_if_diverged(coordinator: Coordinator) -> None:
    """Log a warning when the divergence guard rolled back or the run ends worse than its best."""
    divergence = divergence_summary(coordinator.history)
    if divergence["warning"]:
        event(
            _log,
            "divergence",
            f"{divergence['warning']} (the ledger's guard field says why).",
            logging.WARNING,
            rollbacks=len(divergence["rollbacks"]),
            suspects=divergence["suspects"],
        )


def _say_if_stopped(reason: str | None) -> None:
    """Log why the run ended before ``federation.rounds`` (the central privacy budget)."""
    if reason is not None:
        # `lensemble simulate` over the network reads the reason from this event's field.
        event(_log, "stopped_early", f"Stopped early: {reason}", logging.WARNING, reason=reason)


def _participant_credentials(config: LensembleConfig, participant_id: str) -> str | None:
    """Check this participant's TLS material at start; returns its bearer token, if any.

    Raises:
        ConfigError: A certificate expired or does not name ``participant_id``, or a TLS or
            token file is missing.
    """
    warn_if_insecure(config)
    check_certificates(config, participant_id)
    tls = config.network.tls
    if tls.enabled and tls.client_auth and tls.cert_file:
        check_own_certificate(
            Path(str(identity_path(tls.cert_file, participant_id))), participant_id
        )
    return participant_token(config, participant_id)


def _architecture(initial_params: InitialParams) -> dict[str, TensorSpec]:
    """The global model's parameters (name -> spec) of ``theta_0``; a built one goes at once."""
    theta0 = initial_params() if callable(initial_params) else initial_params
    return global_architecture(theta0)  # only names and shapes: a model's worth of memory goes


def _own_faults(faults: FaultPlan | None, participant_id: str, learner: Learner) -> FaultPlan:
    """The faults of ``faults`` that this participant applies to itself.

    Raises:
        UsageError: A fault kills a rank of a participant whose learner has no ranks.
    """
    own = (faults or FaultPlan()).of_participant(participant_id)
    kills = [f for f in own.faults if f.kind == "rank_kill"]
    if kills and not callable(getattr(learner, "arm_rank_kill", None)):
        raise UsageError(
            f"--faults {kills[0].spec()} kills a rank of '{participant_id}', which runs "
            "as one process;",
            remediation="give it several ranks (federation.participants[i].ranks) or drop "
            "the fault.",
        )
    return own
