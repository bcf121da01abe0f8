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
import subprocess
import sys
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
    write_compose,
)
from lensemble.render.container import STATE_DIR
from lensemble.stack import StackFailed
from lensemble.stack.engine import DockerComposeEngine, Engine
from lensemble.stack.ready_parse import ReadyLine, check_ready_line, first_ready_line

RECORD_NAME = "stack.json"
COMPOSE_NAME = "compose.yaml"
CERTS_NAME = "certs"
#: The coordinator's ledger, copied out of its container when the run finishes.
LEDGER_NAME = "ledger.jsonl"
#: Seconds between two looks at the containers while waiting.
POLL_S = 1.0
#: Seconds creating, and then starting, the containers may take each (``--start-timeout``).
#: Measured here with overlay2: 2-5 s to create five containers; vfs copies the whole image
#: (about 1.1 GB) for each, which took minutes on a loaded machine.
START_TIMEOUT_S = 900.0

Echo = Callable[[str], None]
EngineFactory = Callable[["StackRecord"], Engine]
MakeCerts = Callable[[Path, Path], None]


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


#: How much of a container's last error line a stack error quotes (characters).
ERROR_QUOTE_CHARS = 600


def last_error(lines: Iterable[str]) -> str | None:
    """The last ``error: ...`` line a Lensemble process wrote (its text, bounded), if any."""
    said = None
    for line in lines:
        if line.startswith("error: "):
            said = line.removeprefix("error: ").strip()
    return said[:ERROR_QUOTE_CHARS] if said else None


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


def run_certs_init(certs_dir: Path, config_file: Path) -> None:
    """Create the development CA and one key pair per identity with ``lensemble certs init``.

    Raises:
        StackFailed: The command failed.
    """
    args = [
        sys.executable,
        "-c",
        "from lensemble.cli import main; main()",
        "certs",
        "init",
        str(certs_dir),
        "--config",
        str(config_file),
    ]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        raise StackFailed(
            f"`lensemble certs init {certs_dir}` failed: {reason[-1]}",
            remediation="Create the certificates yourself with that command, then run again.",
        )


def prepare_certs(
    certs_dir: Path, config_file: Path, identities: Sequence[str], make_certs: MakeCerts
) -> None:
    """Make sure every identity has its TLS folder, readable by the containers' user.

    Creates the certificates when none exist. The containers run as UID 10001, not as the
    user who made the files, so each identity folder becomes world-readable while ``certs_dir``
    itself becomes ``0700``: other users on the host cannot reach into it, and the CA key in
    ``certs_dir`` (never mounted) keeps its own mode.

    Args:
        certs_dir: The folder ``lensemble certs init`` fills.
        config_file: The container config (its host names become certificate SANs).
        identities: ``coordinator`` and every participant id.
        make_certs: Creates the certificates (``certs_dir``, ``config_file``).

    Raises:
        StackFailed: Only some identities have certificates, or creating them failed.
    """

    def missing() -> list[str]:
        return [i for i in identities if not (certs_dir / i / "tls.crt").is_file()]

    absent = missing()
    if absent and len(absent) < len(identities):
        raise StackFailed(
            f"{certs_dir} has no certificates for {', '.join(absent)} but has some for others "
            "(the participants changed since it was made).",
            remediation=f"Delete {certs_dir} and run again to create a fresh set.",
        )
    if absent:
        make_certs(certs_dir, config_file)
        still = missing()
        if still:
            raise StackFailed(
                f"`lensemble certs init` left no certificate for {', '.join(still)} in "
                f"{certs_dir}.",
                remediation="Check the certificate layout in docs/architecture.md.",
            )
    certs_dir.chmod(0o700)
    for identity in identities:
        folder = certs_dir / identity
        folder.chmod(0o755)
        for item in folder.iterdir():
            if item.is_file():
                item.chmod(0o644)


def round_progress(line: str) -> str | None:
    """A one-line summary of a coordinator log record worth showing while following a run.

    Records are JSON objects (``observability.log_format: json``). Shown: records with a
    ``round`` field (``round 3: committed``; the text is the first of ``message``, ``msg``,
    ``event`` and ``state``, so a logged ledger line shows as ``round 3: closed``; a text that
    already starts with ``round`` is shown as it is) and records at level ERROR or above.

    Returns:
        The summary, or None for lines not worth showing.
    """
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(record, dict):
        return None
    text = next((str(record[k]) for k in ("message", "msg", "event", "state") if record.get(k)), "")
    if "round" in record:
        # Messages that already name their round ("round 3 attempt 0 committed ...") stand alone.
        if text.startswith("round "):
            return text
        return f"round {record['round']}: {text}".rstrip(": ")
    if str(record.get("level", "")).upper() in ("ERROR", "CRITICAL"):
        return f"coordinator error: {text}"
    return None


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
            container = containers.get(name) or engine.container(name)
            if container is None:
                continue
            containers[name] = container
            line = first_ready_line(engine.stdout(container), service=name)
            if line is None:
                state = engine.state(container)
                if state.finished:
                    # Its own one-line error says why (a broken run record names its line);
                    # a coordinator's exit code is passed through, as after a run.
                    said = last_error(engine.follow(container, new_only=False))
                    why = f": {said}" if said else "."
                    code = state.exit_code
                    passed = (
                        code
                        if name == COORDINATOR
                        and code in (EXIT_RUN_FAILED, EXIT_BAD_INPUT, EXIT_FAIL_CLOSED)
                        else EXIT_RUN_FAILED
                    )
                    raise StackFailed(
                        f"{name} stopped with exit code {code} before it was ready{why}",
                        remediation=f"Its log: {record.logs_hint(name)}; then `lensemble down`.",
                        exit_code=passed,
                    )
                continue
            check_ready_line(
                line,
                service=name,
                role=exp.role,
                participant_id=exp.participant_id,
                config_hash=config_hash,
            )
            # Ready means announced and healthy: a container without a healthcheck, or one that
            # already finished its run cleanly, counts as healthy.
            state = engine.state(container)
            if state.health not in ("", "healthy") and not (
                state.finished and state.exit_code == 0
            ):
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
            names = ", ".join(sorted(pending))
            failing = sorted(unhealthy & pending.keys())
            raise StackFailed(
                f"{names} not ready after {timeout_s:.0f} s"
                + (f" ({', '.join(failing)}: healthcheck failing)." if failing else "."),
                remediation=f"Look at the logs ({record.logs_hint(sorted(pending)[0])}); the "
                "stack is still up: `lensemble down` tears it down.",
            )
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


def committed_hashes(ledger: bytes) -> list[str]:
    """Model hashes of the committed (``closed``) rounds of a ledger, in order.

    A line wraps its round record under ``record`` (ledger v2, docs/run-record.md). Lines that
    are not JSON objects with a string ``model_hash`` are skipped: the ledger is read only to
    report the run, never trusted for anything else (``lensemble verify`` checks it).
    """
    hashes: list[str] = []
    for raw in ledger.splitlines():
        try:
            line = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        record = line.get("record") if isinstance(line, dict) else None
        if isinstance(record, dict) and record.get("state") == "closed":
            value = record.get("model_hash")
            if isinstance(value, str):
                hashes.append(value)
    return hashes


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
    record_path = stack_dir / RECORD_NAME
    if record_path.exists():
        running = StackRecord.load(record_path)
        raise UsageError(
            f"A stack (Compose project '{running.project}') is already up from {stack_dir}.",
            remediation="Tear it down first with `lensemble down`.",
        )
    files = write_compose(config, stack_dir / COMPOSE_NAME, source=source, certs_dir=CERTS_NAME)
    if config.network.tls.enabled:
        prepare_certs(
            stack_dir / CERTS_NAME,
            files.config,
            [COORDINATOR, *config.participant_ids],
            make_certs,
        )
    record = StackRecord(
        substrate="compose",
        project=config.run.name,
        compose_file=str(files.compose.resolve()),
        profile=profile,
        command=list(command),
    )
    engine = (engine_factory or _docker_engine)(record)
    check_image(engine, config, profile)
    # Recorded before starting: a start that fails halfway is still torn down by `down`.
    record.save(record_path)
    expected = expected_services(config, profile)
    echo(f"creating Compose project '{record.project}' (profile {profile}) from {files.compose}")
    began = clock()
    engine.create(timeout_s=start_timeout_s, echo=echo)
    echo(f"created {len(expected)} containers in {clock() - began:.0f} s; starting")
    engine.start(timeout_s=start_timeout_s, echo=echo)
    expected_hash = config_hash(config)
    ready = wait_ready(
        engine,
        expected,
        record=record,
        config_hash=expected_hash,
        timeout_s=ready_timeout_s or config.federation.join_timeout_s,
        echo=echo,
        clock=clock,
        sleep=sleep,
    )
    echo(
        f"stack ready after {clock() - began:.0f} s: coordinator and {len(expected) - 1} "
        f"participants on config hash {expected_hash}; following {config.federation.rounds} "
        "rounds"
    )
    coordinator = engine.container(COORDINATOR)
    if coordinator is None:
        raise StackFailed(
            "The coordinator's container disappeared after it was ready.",
            remediation="Something else removed it; `lensemble down` cleans up.",
        )
    code = follow_run(engine, coordinator, echo=echo, sleep=sleep)
    if code != 0:
        passed = code if code in (EXIT_RUN_FAILED, EXIT_BAD_INPUT, EXIT_FAIL_CLOSED) else 1
        raise StackFailed(
            f"The run failed: the coordinator exited with code {code}.",
            remediation=f"Its log: {record.logs_hint(COORDINATOR)}; tear the stack down with "
            "`lensemble down`.",
            exit_code=passed,
        )
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
    return StackRun(ready=ready, ledger=ledger_path, model_hashes=hashes)


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
