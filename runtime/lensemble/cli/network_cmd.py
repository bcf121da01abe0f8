"""Process commands: ``coordinator``, ``participant``, ``serve``, ``health`` and ``certs init``.

The process contract these implement is ``docs/architecture.md``. grpc, torch and the world
model are imported inside the commands, never at module import.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from lensemble.cli.options import SET_HELP, load
from lensemble.errors import EXIT_INTERRUPTED, UsageError
from lensemble.render.container import CONFIG_PATH, TLS_DIR

if TYPE_CHECKING:
    from lensemble.config import LensembleConfig
    from lensemble.network.launch.harness import PortOptions

app = typer.Typer()
certs_app = typer.Typer(
    help="Development certificates for the network transport.", no_args_is_help=True
)
app.add_typer(certs_app, name="certs")

CONTAINER_CONFIG = CONFIG_PATH
ROLE_ENV = "LENSEMBLE_ROLE"
LINGER_ENV = "LENSEMBLE_LINGER"
CONFIG_ENV = "LENSEMBLE_CONFIG"

_config_option = typer.Option(
    None,
    "--config",
    "-c",
    help=f"Config file (default: ${CONFIG_ENV}, else config/local.yaml).",
    metavar="FILE",
)
_set_option = typer.Option(None, "--set", "-s", help=SET_HELP, metavar="PATH=VALUE")
_health_port_option = typer.Option(
    None,
    "--health-port",
    min=0,
    max=65535,
    help="Port of the gRPC health service (default network.health_port; 0 picks a free one, "
    "reported in the ready line).",
)
_metrics_port_option = typer.Option(
    None,
    "--metrics-port",
    min=0,
    max=65535,
    help="Port of /metrics (default network.metrics_port; 0 picks a free one, reported in the "
    "ready line).",
)
_id_option = typer.Option(
    None,
    "--id",
    help="Participant id (default: $LENSEMBLE_PARTICIPANT_ID, else the StatefulSet pod name).",
)


def _config(
    path: Path | None,
    overrides: list[str] | None,
    default: str | None = None,
    *,
    network: bool = False,
) -> LensembleConfig:
    chosen = path or (Path(os.environ[CONFIG_ENV]) if os.environ.get(CONFIG_ENV) else None)
    if chosen is None and default is not None:
        chosen = Path(default)
    cfg = load(chosen, overrides)
    if network and cfg.federation.transport != "network":
        # Separate processes are the network transport: validate the config as one, so the
        # network-only rules (TLS, residency) apply before anything starts.
        raise UsageError(
            f"federation.transport is '{cfg.federation.transport}' in {chosen or 'the config'}; "
            "coordinator and participant processes talk over the network;",
            remediation="set federation.transport: network in the config, or pass "
            "--set federation.transport=network.",
        )
    return cfg


def _quiet_grpc_core() -> None:
    """Keep gRPC's C-core log lines off stderr: our own one-sentence errors say what failed.

    Set GRPC_VERBOSITY yourself (e.g. DEBUG) to see them.
    """
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")


def _ports(port: int | None, health_port: int | None, metrics_port: int | None) -> PortOptions:
    _quiet_grpc_core()
    from lensemble.network.launch.harness import PortOptions

    return PortOptions(port=port, health_port=health_port, metrics_port=metrics_port)


def _stopped() -> typer.Exit:
    sys.stderr.write("stopped by signal; exiting.\n")
    return typer.Exit(EXIT_INTERRUPTED)


def _run_coordinator(cfg: LensembleConfig, ports: PortOptions, *, linger: bool = False) -> None:
    from lensemble.model.inner_loop import initial_global_parameters
    from lensemble.network.launch.process import run_coordinator
    from lensemble.network.shared.transport_errors import ShutdownRequested

    try:
        # A builder, not the tensors: the coordinator keeps only its own copy of theta_0.
        run_coordinator(cfg, lambda: initial_global_parameters(cfg), ports, linger=linger)
    except ShutdownRequested:
        raise _stopped() from None


def _run_participant(
    cfg: LensembleConfig,
    participant_id: str | None,
    ports: PortOptions,
    *,
    linger: bool = False,
    faults: str = "",
) -> None:
    from lensemble.federation.faults import participant_faults
    from lensemble.network.shared.identity import resolve_participant_id

    pid = resolve_participant_id(cfg, participant_id, os.environ)
    plan = participant_faults(faults, cfg.participant_ids, pid)
    from lensemble.learner import Learner
    from lensemble.model.inner_loop import initial_global_parameters
    from lensemble.network.launch.process import run_participant
    from lensemble.network.shared.transport_errors import ShutdownRequested
    from lensemble.ranks.learner import build_learner
    from lensemble.ranks.placement import node_rank

    layout = cfg.rank_layout(pid)
    if node_rank(layout) > 0:
        # Another node of a multi-node participant: only node 0 talks to the coordinator.
        from lensemble.ranks.follow import follow

        follow(cfg, pid)
        return
    built: list[Learner] = []

    def learner() -> Learner:
        seed = None
        if cfg.participant(pid).privacy is not None:
            from lensemble.network.participant.privacy_seed import noise_seed

            seed = noise_seed(cfg, pid)  # its own secret, never the run seed
        built.append(build_learner(cfg, pid, noise_seed=seed))
        return built[-1]

    try:
        # A builder, not the tensors: only theta_0's architecture is kept.
        run_participant(
            cfg,
            pid,
            learner,
            lambda: initial_global_parameters(cfg),
            ports,
            linger=linger,
            faults=plan,
        )
    except ShutdownRequested:
        raise _stopped() from None
    finally:
        for made in built:
            close = getattr(made, "close", None)
            if close is not None:
                close()


@app.command()
def coordinator(
    config: Path | None = _config_option,
    set_: list[str] = _set_option,
    port: int | None = typer.Option(
        None, "--port", min=0, max=65535, help="gRPC port (default network.port; 0: a free one)."
    ),
    health_port: int | None = _health_port_option,
    metrics_port: int | None = _metrics_port_option,
) -> None:
    """Run the coordinator: serve the participants over gRPC and commit every round.

    Resumes from the last checkpoint in run.output_dir when there is one. Prints one JSON ready
    line on stdout when serving; logs go to stderr.
    """
    cfg = _config(config, set_, network=True)
    _run_coordinator(cfg, _ports(port, health_port, metrics_port))


@app.command()
def participant(
    config: Path | None = _config_option,
    participant_id: str | None = _id_option,
    set_: list[str] = _set_option,
    health_port: int | None = _health_port_option,
    metrics_port: int | None = _metrics_port_option,
    faults: str = typer.Option(
        "",
        "--faults",
        metavar="SPEC",
        help="Fault injection for simulations: rank_kill, misreport and attack entries naming "
        "this participant (e.g. 'rank_kill:alpine@2', 'scaled:alpine@0-=-9.5', 'alie:alpine@0-'; "
        "docs/attacks.md) are applied as in `lensemble simulate`; others are ignored.",
    ),
) -> None:
    """Run one participant: join the coordinator, train on local data, send pseudo-gradients.

    Prints one JSON ready line on stdout once joined; logs go to stderr.
    """
    cfg = _config(config, set_, network=True)
    _run_participant(cfg, participant_id, _ports(None, health_port, metrics_port), faults=faults)


@app.command()
def serve(
    config: Path | None = typer.Option(
        None,
        "--config",
        "-c",
        help=f"Config file (default: ${CONFIG_ENV}, else {CONTAINER_CONFIG}).",
        metavar="FILE",
    ),
    participant_id: str | None = _id_option,
    set_: list[str] = _set_option,
    health_port: int | None = _health_port_option,
    metrics_port: int | None = _metrics_port_option,
) -> None:
    """Container entry point: run the role named by $LENSEMBLE_ROLE (coordinator|participant).

    With LENSEMBLE_LINGER=true (set by the Helm chart) the process idles after the run instead of
    exiting, so Kubernetes does not restart a finished pod in a loop.
    """
    role = os.environ.get(ROLE_ENV, "")
    if role not in ("coordinator", "participant"):
        raise UsageError(
            f"{ROLE_ENV} is {role!r};",
            remediation=f"set {ROLE_ENV}=coordinator or {ROLE_ENV}=participant.",
        )
    cfg = _config(config, set_, default=CONTAINER_CONFIG, network=True)
    ports = _ports(None, health_port, metrics_port)
    linger = os.environ.get(LINGER_ENV, "").strip().lower() in ("1", "true", "yes")
    if role == "coordinator":
        _run_coordinator(cfg, ports, linger=linger)
    else:
        _run_participant(cfg, participant_id, ports, linger=linger)


@app.command()
def health(
    host: str = typer.Option("127.0.0.1", "--host", help="Host of the process to check."),
    port: int = typer.Option(50052, "--port", min=1, max=65535, help="Its health port."),
    ready: bool = typer.Option(
        False, "--ready", help="Ask for readiness (lensemble.Readiness) instead of liveness."
    ),
    timeout: float = typer.Option(3.0, "--timeout", min=0.1, help="Deadline (seconds)."),
) -> None:
    """Exit 0 when the process at HOST:PORT reports SERVING, 1 otherwise (container HEALTHCHECK)."""
    from lensemble.network.shared.health import LIVENESS_SERVICE, READINESS_SERVICE, check

    service = READINESS_SERVICE if ready else LIVENESS_SERVICE
    status = check(host, port, service, timeout)
    what = "ready" if ready else "live"
    if status == "SERVING":
        sys.stdout.write(f"{host}:{port} is {what}\n")
        return
    failure = status.removeprefix("UNREACHABLE: ")
    code = failure.split(" ", 1)[0]
    if code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
        reason = (
            f"nothing answered within {timeout:g} s ({code}); check that "
            "the process runs and that --host/--port name its health port (the ready line's "
            "health_port, by default network.health_port)."
        )
    elif status == "NOT_SERVING":
        reason = (
            "it runs but reports NOT_SERVING (a coordinator before its first round, or a "
            "participant not yet joined); check again later or read its log."
        )
    else:
        reason = (
            f"the health call ended with {failure}; is --port the health port of a Lensemble "
            "process?"
        )
    sys.stderr.write(f"error: {host}:{port} is not {what}: {reason}\n")
    raise typer.Exit(1)


@certs_app.command("init")
def certs_init(
    outdir: Path = typer.Argument(..., help="Output folder (created).", metavar="OUTDIR"),
    config: Path | None = _config_option,
    set_: list[str] = _set_option,
    hosts: list[str] = typer.Option(
        None, "--host", help="Extra host name or IP address of the coordinator (repeatable)."
    ),
) -> None:
    """Create a development CA, the coordinator's certificate and one per participant.

    Layout: OUTDIR/ca.crt, ca.key, and OUTDIR/<identity>/tls.crt, tls.key, ca.crt for identity
    'coordinator' and every participant id. An existing CA in OUTDIR is reused unless it has
    expired or expires within network.tls.expiry_warning_days: then a new CA replaces it.
    """
    from lensemble.cli.output import require_folder
    from lensemble.network.shared.certs import init_certs

    require_folder(outdir, "OUTDIR")
    cfg = _config(config, set_)
    issued = init_certs(outdir, cfg, hosts or [])
    if issued.ca_reused:
        ca = "reused the CA"
    elif issued.ca_replaced:
        ca = f"renewed the development CA ({issued.ca_replaced})"
    else:
        ca = "created a development CA"
    if issued.ca_expires is not None:
        ca += f", valid until {issued.ca_expires:%Y-%m-%d},"
    ca += " in"
    sys.stderr.write(  # status, not a product: stdout stays empty
        f"{ca} {outdir}; issued {', '.join(issued.identities)}; coordinator names: "
        f"{', '.join(issued.server_names)}\n"
        f"keep {outdir / 'ca.key'} out of every container; mount {outdir}/<identity>/ at "
        f"{TLS_DIR}\n"
    )
