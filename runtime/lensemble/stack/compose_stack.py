"""``lensemble up --substrate compose`` and ``lensemble down``: the orchestration logic.

``up`` renders the Compose file and container config into a stack folder, creates the
certificates when TLS is on, records what it starts (``stack.json``), starts the project,
waits until every expected service has printed its ready line (checking role, participant id
and config hash), follows the coordinator's rounds and returns when the coordinator exits:
normally, or with :class:`~lensemble.stack.StackFailed` carrying the coordinator's exit code.
``down`` tears down exactly what the record names, once: it removes the record afterwards, so a
second ``down`` finds nothing to do.

The engine, the certificate maker, the clock and ``sleep`` are parameters, so all of this is
tested without Docker (``tests/compose/test_stack.py``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from lensemble.config import LensembleConfig, config_hash
from lensemble.errors import EXIT_BAD_INPUT, EXIT_FAIL_CLOSED, EXIT_RUN_FAILED, UsageError
from lensemble.render.compose import (
    COORDINATOR,
    COORDINATOR_VOLUME,
    participant_service,
    profile_images,
)
from lensemble.render.compose_files import ComposeFiles, write_compose
from lensemble.render.container import STATE_DIR
from lensemble.stack import StackFailed
from lensemble.stack.certs import MakeCerts, prepare_certs, run_certs_init
from lensemble.stack.engine import ContainerState, DockerComposeEngine, Engine
from lensemble.stack.ready_parse import ReadyLine, check_ready_line, first_ready_line
from lensemble.stack.run_output import committed_hashes, last_error, round_progress

RECORD_NAME = "stack.json"
COMPOSE_NAME = "compose.yaml"
CERTS_NAME = "certs"
#: The coordinator's ledger, copied out of its container when the run finishes.
LEDGER_NAME = "ledger.jsonl"
#: Seconds between two looks at the containers while waiting.
POLL_S = 1.0
#: Seconds creating, and then starting, the containers may take each (``--start-timeout``).
#: A slow storage driver (vfs copies the whole image for each container) needs minutes
#: (docs/performance.md#images-and-the-compose-stack).
START_TIMEOUT_S = 900.0

Echo = Callable[[str], None]
EngineFactory = Callable[["StackRecord"], Engine]


@dataclass(frozen=True)
class StackRecord:
    """What ``up`` started, so that ``down`` tears down exactly that, once.

    Attributes:
        substrate: ``compose``.
        project: Compose project name (the run name).
        compose_file: Absolute path of the rendered Compose file.
        profile: The profile started (``cpu`` or ``gpu``).
        command: The Compose command used (``["docker", "compose"]`` or ``["docker-compose"]``).
    """

    substrate: str
    project: str
    compose_file: str
    profile: str
    command: list[str]

    def save(self, path: Path) -> None:
        """Write the record as JSON."""
        path.write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> StackRecord:
        """Read a record written by :meth:`save`.

        Raises:
            UsageError: The file is not a record (edited or truncated).
        """
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(
                substrate=str(data["substrate"]),
                project=str(data["project"]),
                compose_file=str(data["compose_file"]),
                profile=str(data["profile"]),
                command=[str(c) for c in data["command"]],
            )
        except (OSError, ValueError, KeyError, TypeError):
            raise UsageError(
                f"{path} is not a stack record written by `lensemble up`.",
                remediation="Tear the project down with `docker compose -p <run name> down` "
                "and delete the file.",
            ) from None

    def logs_hint(self, service: str) -> str:
        """The command that shows one service's log."""
        return (
            f"{' '.join(self.command)} -p {self.project} -f {self.compose_file} "
            f"--profile {self.profile} logs {service}"
        )


@dataclass(frozen=True)
class ExpectedService:
    """A service ``up`` waits for, and what its ready line must say."""

    service: str
    role: str
    participant_id: str | None


def default_stack_dir(config: LensembleConfig) -> Path:
    """Where ``up`` renders and records a config's stack: ``<run.output_dir>/compose``."""
    return Path(config.run.output_dir) / "compose"


def expected_services(config: LensembleConfig, profile: str) -> list[ExpectedService]:
    """The coordinator, then every participant's service of ``profile`` in canonical order."""
    return [
        ExpectedService(COORDINATOR, "coordinator", None),
        *(
            ExpectedService(participant_service(pid, profile), "participant", pid)
            for pid in config.participant_ids
        ),
    ]


def _passed_exit_code(code: int) -> int:
    """A coordinator's own failure codes (1, 2, 3) pass through; any other code is 1."""
    return code if code in (EXIT_RUN_FAILED, EXIT_BAD_INPUT, EXIT_FAIL_CLOSED) else EXIT_RUN_FAILED


def _stopped(
    engine: Engine, container: str, name: str, code: int, record: StackRecord
) -> StackFailed:
    """The failure of a service that exited with ``code`` before it printed its ready line."""
    # Its own one-line error says why (a broken run record names its line); a coordinator's
    # exit code is passed through, as after a run.
    said = last_error(engine.follow(container, new_only=False))
    return StackFailed(
        f"{name} stopped with exit code {code} before it was ready{f': {said}' if said else '.'}",
        remediation=f"Its log: {record.logs_hint(name)}; then `lensemble down`.",
        exit_code=_passed_exit_code(code) if name == COORDINATOR else EXIT_RUN_FAILED,
    )


def _announced(
    engine: Engine,
    expected: ExpectedService,
    containers: dict[str, str],
    *,
    record: StackRecord,
    config_hash: str,
) -> ReadyLine | None:
    """The service's checked ready line, or None while it has no container or line yet.

    Raises:
        StackFailed: The service finished without a ready line.
        IntegrityError: The ready line names another config hash.
    """
    name = expected.service
    container = containers.get(name) or engine.container(name)
    if container is None:
        return None
    containers[name] = container
    line = first_ready_line(engine.stdout(container), service=name)
    if line is None:
        state = engine.state(container)
        if state.finished:
            raise _stopped(engine, container, name, state.exit_code, record)
        return None
    check_ready_line(
        line,
        service=name,
        role=expected.role,
        participant_id=expected.participant_id,
        config_hash=config_hash,
    )
    return line


def _healthy(state: ContainerState) -> bool:
    """Whether a container counts as healthy once it announced itself."""
    # Ready means announced and healthy: a container without a healthcheck, or one that already
    # finished its run cleanly, counts as healthy.
    return state.health in ("", "healthy") or (state.finished and state.exit_code == 0)


def _not_ready(
    pending: Iterable[str], unhealthy: set[str], timeout_s: float, record: StackRecord
) -> StackFailed:
    names = sorted(pending)
    failing = sorted(unhealthy.intersection(names))
    return StackFailed(
        f"{', '.join(names)} not ready after {timeout_s:.0f} s"
        + (f" ({', '.join(failing)}: healthcheck failing)." if failing else "."),
        remediation=f"Look at the logs ({record.logs_hint(names[0])}); the "
        "stack is still up: `lensemble down` tears it down.",
    )


def wait_ready(
    engine: Engine,
    expected: Sequence[ExpectedService],
    *,
    record: StackRecord,
    config_hash: str,
    timeout_s: float,
    echo: Echo,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, ReadyLine]:
    """Wait until every expected service printed a valid ready line and turned healthy.

    Args:
        engine: The running project.
        expected: Services to wait for, with the role and id each must announce.
        record: The stack, named in hints.
        config_hash: Hash every process must report.
        timeout_s: Seconds to wait in all.
        echo: Prints progress.
        clock: Monotonic clock (seconds).
        sleep: Waits between two looks.

    Returns:
        Ready line per service.

    Raises:
        StackFailed: A service stopped before it was ready, printed something else first, or
            was not ready and healthy within ``timeout_s`` (a failing healthcheck is named).
        IntegrityError: A service reports another config hash.
    """
    deadline = clock() + timeout_s
    pending = {e.service: e for e in expected}
    containers: dict[str, str] = {}
    ready: dict[str, ReadyLine] = {}
    unhealthy: set[str] = set()
    while True:
        for name, exp in list(pending.items()):
            line = _announced(engine, exp, containers, record=record, config_hash=config_hash)
            if line is None:
                continue
            state = engine.state(containers[name])
            if not _healthy(state):
                # A check slower than its timeout on a loaded machine reads as unhealthy, and
                # may pass at the next try: said once, and only the deadline ends the wait.
                if state.health == "unhealthy" and name not in unhealthy:
                    unhealthy.add(name)
                    echo(f"{name} is ready but its healthcheck fails; waiting for it to pass")
                continue
            ready[name] = line
            del pending[name]
            # A container that already finished its run says so: its last healthcheck may have
            # run while it was leaving, which is not a failure.
            shown = "exited" if state.finished else (state.health or state.status)
            echo(f"ready: {name} ({line.endpoint}), {shown}")
        if not pending:
            return ready
        if clock() >= deadline:
            raise _not_ready(pending, unhealthy, timeout_s, record)
        sleep(POLL_S)


def follow_run(
    engine: Engine,
    container: str,
    *,
    echo: Echo,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Show the coordinator's round progress until it stops for good.

    A coordinator that crashes and is restarted by its restart policy is followed again.

    Returns:
        The coordinator's final exit code.
    """
    new_only = False
    while True:
        for line in engine.follow(container, new_only=new_only):
            progress = round_progress(line)
            if progress:
                echo(progress)
        state = engine.state(container)
        if state.finished:
            return state.exit_code
        new_only = True
        sleep(POLL_S)


@dataclass(frozen=True)
class StackRun:
    """What a finished ``lensemble up`` brought back.

    Attributes:
        ready: The ready line of every service.
        ledger: The coordinator's ledger copied into the stack folder, None if unreadable.
        model_hashes: Model hash of every committed round, in order (the hash chain).
    """

    ready: dict[str, ReadyLine]
    ledger: Path | None
    model_hashes: list[str]


def check_image(engine: Engine, config: LensembleConfig, profile: str) -> None:
    """Refuse to start when the profile's image must be local (pull policy Never) but is not.

    Raises:
        StackFailed: The image is not on the engine.
    """
    if config.deployment.image.pull_policy != "Never":
        return
    image = profile_images(config)[profile]
    if not engine.image_present(image):
        raise StackFailed(
            f"The image {image} is not on this Docker engine, and deployment.image.pull_policy "
            "is Never.",
            remediation="Build it with `lensemble image build` (without a registry: "
            "`lensemble image base` first, see the README), then run again.",
        )


def _refuse_a_second_stack(stack_dir: Path) -> None:
    """Refuse a folder whose stack is still recorded as up.

    Raises:
        UsageError: ``stack_dir`` holds a stack record.
    """
    record_path = stack_dir / RECORD_NAME
    if record_path.exists():
        running = StackRecord.load(record_path)
        raise UsageError(
            f"A stack (Compose project '{running.project}') is already up from {stack_dir}.",
            remediation="Tear it down first with `lensemble down`.",
        )


def _render_stack(
    config: LensembleConfig, stack_dir: Path, *, source: str, make_certs: MakeCerts
) -> ComposeFiles:
    """The rendered files in ``stack_dir``, with every identity's certificates when TLS is on."""
    files = write_compose(config, stack_dir / COMPOSE_NAME, source=source, certs_dir=CERTS_NAME)
    if config.network.tls.enabled:
        identities = [COORDINATOR, *config.participant_ids]
        prepare_certs(stack_dir / CERTS_NAME, files.config, identities, make_certs)
    return files


def _follow_coordinator(
    engine: Engine, record: StackRecord, *, echo: Echo, sleep: Callable[[float], None]
) -> str:
    """Follow the coordinator's rounds until it exits cleanly; its container.

    Raises:
        StackFailed: Its container is gone, or it exited with a failure (its code passed on).
    """
    coordinator = engine.container(COORDINATOR)
    if coordinator is None:
        raise StackFailed(
            "The coordinator's container disappeared after it was ready.",
            remediation="Something else removed it; `lensemble down` cleans up.",
        )
    code = follow_run(engine, coordinator, echo=echo, sleep=sleep)
    if code != 0:
        raise StackFailed(
            f"The run failed: the coordinator exited with code {code}.",
            remediation=f"Its log: {record.logs_hint(COORDINATOR)}; tear the stack down with "
            "`lensemble down`.",
            exit_code=_passed_exit_code(code),
        )
    return coordinator


def _copy_ledger(
    engine: Engine, coordinator: str, stack_dir: Path, echo: Echo
) -> tuple[Path | None, list[str]]:
    """Copy the coordinator's ledger into ``stack_dir`` and say how the run ended.

    Returns:
        The copy (None when the ledger is unreadable) and the committed hash chain.
    """
    ledger = engine.read_file(coordinator, f"{STATE_DIR}/{LEDGER_NAME}")
    hashes = committed_hashes(ledger) if ledger is not None else []
    ledger_path = None
    if ledger is not None:
        ledger_path = stack_dir / LEDGER_NAME
        ledger_path.write_bytes(ledger)
    final = f"final model {hashes[-1]} after {len(hashes)} committed rounds; " if hashes else ""
    echo(
        f"run finished: {final}checkpoints and ledger are on volume '{COORDINATOR_VOLUME}'"
        + (f" (ledger copied to {ledger_path})" if ledger_path else "")
        + "; `lensemble down` removes the containers (and with --volumes the data)"
    )
    return ledger_path, hashes


def _create_and_start(
    engine: Engine,
    record: StackRecord,
    files: ComposeFiles,
    count: int,
    *,
    timeout_s: float,
    echo: Echo,
    clock: Callable[[], float],
) -> float:
    """Create the project's ``count`` containers, then start them (``timeout_s`` each).

    Returns:
        The clock's reading when creating began (seconds).
    """
    echo(
        f"creating Compose project '{record.project}' (profile {record.profile}) from "
        f"{files.compose}"
    )
    began = clock()
    engine.create(timeout_s=timeout_s, echo=echo)
    echo(f"created {count} containers in {clock() - began:.0f} s; starting")
    engine.start(timeout_s=timeout_s, echo=echo)
    return began


#: What a coordinator prints when its checkpoint already holds every round (``run_over``).
RUN_OVER = "all rounds committed"


def _why_the_start_failed(
    engine: Engine, config: LensembleConfig, stack_dir: Path, record: StackRecord
) -> None:
    """Name the cause when the start failed because the coordinator had already exited.

    Compose then reports only that the participants' start condition failed. A coordinator
    that exited 0 saying all rounds are committed resumed a finished run from its volume: its
    containers are removed (the volumes, with the run, are kept) and the error says what to
    do. One that exited otherwise failed on its own: its exit code and last error line.

    Raises:
        StackFailed: The coordinator had exited; nothing when it had not (the caller re-raises
            Compose's error).
    """
    container = engine.container(COORDINATOR)
    state = engine.state(container) if container is not None else None
    if container is None or state is None or not state.finished:
        return
    if state.exit_code != 0:
        raise _stopped(engine, container, COORDINATOR, state.exit_code, record)
    if not any(RUN_OVER in line for line in engine.follow(container, new_only=False)):
        return  # its log (stderr too) says nothing of a finished run
    engine.down(volumes=False)
    (stack_dir / RECORD_NAME).unlink(missing_ok=True)
    raise StackFailed(
        f"the coordinator's volume already holds a finished run: all "
        f"{config.federation.rounds} rounds of '{config.run.name}' are committed, so the "
        "coordinator exited at once and its participants had nothing to join (the containers "
        "were removed, the volumes kept);",
        remediation="raise federation.rounds (--set federation.rounds=N) to continue that run, "
        "or run `lensemble down --volumes` to delete it and start over.",
    )


def up_compose(
    config: LensembleConfig,
    *,
    stack_dir: Path,
    profile: str,
    command: Sequence[str],
    source: str = "",
    engine_factory: EngineFactory | None = None,
    make_certs: MakeCerts = run_certs_init,
    ready_timeout_s: float | None = None,
    start_timeout_s: float = START_TIMEOUT_S,
    echo: Echo = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> StackRun:
    """Bring a config's Compose stack up, wait for every ready line and follow the run.

    Args:
        config: The validated source config (``federation.transport: network``).
        stack_dir: Folder for the rendered files, the certificates and the stack record.
        profile: ``cpu`` or ``gpu``.
        command: The Compose command (see :func:`lensemble.stack.engine.compose_command`).
        source: Where the config came from, quoted in the rendered files.
        engine_factory: Builds the engine for the record; default Docker Compose.
        make_certs: Creates certificates when there are none (default ``lensemble certs init``).
        ready_timeout_s: Seconds to wait for every ready line; default
            ``federation.join_timeout_s``.
        start_timeout_s: Seconds creating the containers may take, and then starting them.
        echo: Prints progress.
        clock: Monotonic clock (seconds).
        sleep: Waits between two looks.

    Returns:
        The ready lines, the copied ledger and the committed hash chain.

    Raises:
        UsageError: A stack is already up from ``stack_dir``.
        ConfigError: The config cannot run on Compose.
        StackFailed: The image is missing, the stack did not come up, or the run failed; the
            exit code is the coordinator's (1, 2 or 3), else 1.
        IntegrityError: A container reports another config hash.
        ToolMissing: Docker is missing.
    """
    _refuse_a_second_stack(stack_dir)
    files = _render_stack(config, stack_dir, source=source, make_certs=make_certs)
    record = StackRecord(
        "compose", config.run.name, str(files.compose.resolve()), profile, list(command)
    )
    engine = (engine_factory or _docker_engine)(record)
    check_image(engine, config, profile)
    # Recorded before starting: a start that fails halfway is still torn down by `down`.
    record.save(stack_dir / RECORD_NAME)
    expected = expected_services(config, profile)
    try:
        began = _create_and_start(
            engine, record, files, len(expected), timeout_s=start_timeout_s, echo=echo, clock=clock
        )
    except StackFailed:
        _why_the_start_failed(engine, config, stack_dir, record)
        raise
    expected_hash = config_hash(config)
    timeout_s = ready_timeout_s or config.federation.join_timeout_s
    ready = wait_ready(
        engine,
        expected,
        record=record,
        config_hash=expected_hash,
        timeout_s=timeout_s,
        echo=echo,
        clock=clock,
        sleep=sleep,
    )
    echo(
        f"stack ready after {clock() - began:.0f} s: coordinator and {len(expected) - 1} "
        f"participants on config hash {expected_hash}; following {config.federation.rounds} "
        "rounds"
    )
    coordinator = _follow_coordinator(engine, record, echo=echo, sleep=sleep)
    ledger, hashes = _copy_ledger(engine, coordinator, stack_dir, echo)
    return StackRun(ready=ready, ledger=ledger, model_hashes=hashes)


def down_compose(
    stack_dir: Path,
    *,
    volumes: bool = False,
    engine_factory: EngineFactory | None = None,
    echo: Echo = print,
) -> bool:
    """Tear down the stack ``up`` started from ``stack_dir``, exactly once.

    Args:
        stack_dir: The folder ``up`` used.
        volumes: Also delete the stack's volumes (checkpoints, ledger, participant data).
        engine_factory: Builds the engine for the record; default Docker Compose.
        echo: Prints what happened.

    Returns:
        True when something was torn down, False when there was nothing to tear down.

    Raises:
        UsageError: The record is unreadable.
        StackFailed: The teardown failed (the record is kept, so ``down`` can be run again).
    """
    record_path = stack_dir / RECORD_NAME
    if not record_path.is_file():
        echo(f"nothing to tear down: no stack is recorded in {stack_dir}")
        return False
    record = StackRecord.load(record_path)
    (engine_factory or _docker_engine)(record).down(volumes=volumes)
    record_path.unlink()
    kept = "its volumes deleted" if volumes else "volumes kept (add --volumes to delete them)"
    echo(f"torn down: Compose project '{record.project}', {kept}")
    return True


def _docker_engine(record: StackRecord) -> Engine:
    return DockerComposeEngine(
        record.command,
        project=record.project,
        compose_file=Path(record.compose_file),
        profile=record.profile,
    )


def stack_dir_for(config: LensembleConfig, override: Path | None) -> Path:
    """The stack folder: ``override`` if given, else :func:`default_stack_dir`, absolute."""
    return Path(os.path.abspath(override or default_stack_dir(config)))
