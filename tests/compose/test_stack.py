"""``lensemble up``/``down`` orchestration with a fake engine: no Docker needed.

The fake engine plays the containers: what each writes to stdout over successive looks, its
states, and the coordinator's log. A fake clock makes timeouts instant.
"""

from __future__ import annotations

import json
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lensemble.config import LensembleConfig, config_hash, load_config
from lensemble.errors import IntegrityError, ToolMissing, UsageError
from lensemble.stack import StackFailed
from lensemble.stack.certs import prepare_certs
from lensemble.stack.compose_stack import RECORD_NAME, StackRecord, down_compose, up_compose
from lensemble.stack.engine import ContainerState, DockerComposeEngine, compose_command
from lensemble.stack.ready_parse import check_ready_line, first_ready_line, parse_ready_line
from lensemble.stack.run_output import round_progress
from tests.compose.conftest import REPO
from tests.support.cli import run_cli

RUNNING = ContainerState("running", 0)


@pytest.fixture
def cfg() -> LensembleConfig:
    return load_config(REPO / "config/local.yaml", ["federation.transport=network"])


def ready_json(role: str, pid: str | None, hash_: str, **extra: Any) -> str:
    record = {
        "event": "ready",
        "role": role,
        "participant_id": pid,
        "endpoint": "0.0.0.0:50051" if role == "coordinator" else f"{pid}:0",
        "config_hash": hash_,
        "version": "0.1.0",
        **extra,
    }
    return json.dumps(record) + "\n"


@dataclass
class FakeContainer:
    """stdout seen at each look (the last one repeats) and states (the last one repeats)."""

    stdouts: list[str]
    states: list[ContainerState] = field(default_factory=lambda: [RUNNING])
    logs: list[list[str]] = field(default_factory=list)

    def next_stdout(self) -> str:
        return self.stdouts.pop(0) if len(self.stdouts) > 1 else self.stdouts[0]

    def next_state(self) -> ContainerState:
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]


class FakeEngine:
    def __init__(
        self,
        containers: dict[str, FakeContainer],
        *,
        up_error: Exception | None = None,
        images: tuple[str, ...] = ("lensemble:0.1.0-cpu",),
        files: dict[tuple[str, str], bytes] | None = None,
    ):
        self.containers = containers
        self.up_error = up_error
        self.images = images
        self.files = files or {}
        self.calls: list[Any] = []
        self.started = False

    def create(self, *, timeout_s: float, echo: Any) -> None:
        self.calls.append("create")
        if self.up_error:
            raise self.up_error

    def start(self, *, timeout_s: float, echo: Any) -> None:
        self.calls.append("start")
        self.started = True

    def image_present(self, image: str) -> bool:
        return image in self.images

    def read_file(self, container: str, path: str) -> bytes | None:
        return self.files.get((container, path))

    def down(self, *, volumes: bool) -> None:
        self.calls.append(("down", volumes))

    def container(self, service: str) -> str | None:
        return service if self.started and service in self.containers else None

    def stdout(self, container: str) -> str:
        return self.containers[container].next_stdout()

    def state(self, container: str) -> ContainerState:
        return self.containers[container].next_state()

    def follow(self, container: str, *, new_only: bool) -> Iterator[str]:
        self.calls.append(("follow", container, new_only))
        logs = self.containers[container].logs
        yield from logs.pop(0) if logs else []


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def healthy_stack(cfg: LensembleConfig, *, coordinator_exit: int = 0) -> dict[str, FakeContainer]:
    h = config_hash(cfg)
    containers = {
        "coordinator": FakeContainer(
            [ready_json("coordinator", None, h)],
            states=[ContainerState("exited", coordinator_exit)],
            logs=[
                [
                    ready_json("coordinator", None, h).strip(),
                    json.dumps({"level": "INFO", "round": 1, "message": "committed"}),
                    "not json",
                    json.dumps({"level": "INFO", "message": "participant joined"}),
                    json.dumps({"level": "INFO", "round": 2, "message": "committed"}),
                ]
            ],
        )
    }
    for i, pid in enumerate(cfg.participant_ids):
        # Participants become ready after a few looks.
        containers[f"participant-{pid}"] = FakeContainer(
            [""] * i + ['{"event": "re'] + [ready_json("participant", pid, h)]
        )
    return containers


def no_certs(certs_dir: Path, config_file: Path) -> None:
    raise AssertionError("certificates exist; nothing should create them")


def make_fake_certs(certs_dir: Path, config_file: Path) -> None:
    """What `lensemble certs init` writes (contract layout), with restrictive modes."""
    assert config_file.is_file()
    certs_dir.mkdir(parents=True, exist_ok=True)
    (certs_dir / "ca.crt").write_text("ca")
    (certs_dir / "ca.key").write_text("ca key")
    (certs_dir / "ca.key").chmod(0o600)
    cfg = load_config(config_file)
    for identity in ["coordinator", *cfg.participant_ids]:
        folder = certs_dir / identity
        folder.mkdir(mode=0o700)
        for name in ("tls.crt", "tls.key", "ca.crt"):
            (folder / name).write_text(name)
            (folder / name).chmod(0o600)


def run_up(
    cfg: LensembleConfig, stack_dir: Path, engine: FakeEngine, **kwargs: Any
) -> tuple[list[str], FakeClock]:
    out: list[str] = []
    clock = FakeClock()
    up_compose(
        cfg,
        stack_dir=stack_dir,
        profile="cpu",
        command=["fake-compose"],
        engine_factory=lambda record: engine,
        make_certs=kwargs.pop("make_certs", make_fake_certs),
        echo=out.append,
        clock=clock,
        sleep=clock.sleep,
        **kwargs,
    )
    return out, clock


# ----------------------------------------------------------------------------- ready lines
def test_ready_line_parses() -> None:
    line = ready_json("participant", "alpine", "sha256-canon-v1:ab").strip()
    ready = parse_ready_line(line, service="participant-alpine")
    assert (ready.role, ready.participant_id, ready.config_hash) == (
        "participant",
        "alpine",
        "sha256-canon-v1:ab",
    )


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("Starting server...", "where its ready line belongs"),
        ('{"event": "log", "message": "hi"}', "where its ready line belongs"),
        ("[1, 2]", "where its ready line belongs"),
        (
            '{"event": "ready", "role": "boss", "endpoint": "x", "config_hash": "h", "version": "v"}',
            "role",
        ),
        (
            '{"event": "ready", "role": "coordinator", "endpoint": "x", "version": "v"}',
            "config_hash",
        ),
    ],
)
def test_bad_ready_lines_name_the_service(line: str, needle: str) -> None:
    with pytest.raises(StackFailed) as info:
        parse_ready_line(line, service="participant-alpine")
    assert "participant-alpine" in str(info.value)
    assert needle in str(info.value)


def test_first_ready_line_waits_for_a_complete_line() -> None:
    assert first_ready_line("", service="s") is None
    assert first_ready_line('{"event": "rea', service="s") is None
    line = ready_json("coordinator", None, "h") + "later output\n"
    ready = first_ready_line(line, service="s")
    assert ready is not None and ready.role == "coordinator"


def test_ready_line_from_the_wrong_process_or_config() -> None:
    ready = parse_ready_line(ready_json("participant", "delta", "h1").strip(), service="s")
    with pytest.raises(StackFailed, match="participant 'alpine'"):
        check_ready_line(
            ready, service="s", role="participant", participant_id="alpine", config_hash="h1"
        )
    with pytest.raises(IntegrityError) as info:
        check_ready_line(
            ready, service="s", role="participant", participant_id="delta", config_hash="h2"
        )
    assert info.value.exit_code == 3


# ----------------------------------------------------------------------------------- up
def test_up_waits_for_every_ready_line_and_follows_the_rounds(
    cfg: LensembleConfig, tmp_path: Path
) -> None:
    engine = FakeEngine(healthy_stack(cfg))
    out, clock = run_up(cfg, tmp_path, engine)
    ready = [line for line in out if line.startswith("ready: ")]
    assert sorted(ready) == sorted(
        [f"ready: participant-{p} ({p}:0), running" for p in cfg.participant_ids]
        + ["ready: coordinator (0.0.0.0:50051), exited"]
    )
    assert "round 1: committed" in out and "round 2: committed" in out
    assert not any("participant joined" in line for line in out)
    assert out[-1].startswith("run finished")
    assert clock.now > 0  # some participants needed several looks
    assert engine.calls == ["create", "start", ("follow", "coordinator", False)]
    record = StackRecord.load(tmp_path / RECORD_NAME)
    assert (record.project, record.profile, record.command) == (
        "lensemble-local",
        "cpu",
        ["fake-compose"],
    )
    assert Path(record.compose_file) == tmp_path / "compose.yaml"
    assert (tmp_path / "lensemble.yaml").is_file()


def test_up_refuses_a_second_stack_in_the_same_folder(cfg: LensembleConfig, tmp_path: Path) -> None:
    run_up(cfg, tmp_path, FakeEngine(healthy_stack(cfg)))
    engine = FakeEngine(healthy_stack(cfg))
    with pytest.raises(UsageError, match="lensemble down"):
        run_up(cfg, tmp_path, engine)
    assert engine.calls == []


def test_wrong_config_hash_fails_closed(cfg: LensembleConfig, tmp_path: Path) -> None:
    containers = healthy_stack(cfg)
    containers["participant-delta"].stdouts = [
        ready_json("participant", "delta", "sha256-canon-v1:other")
    ]
    with pytest.raises(IntegrityError) as info:
        run_up(cfg, tmp_path, FakeEngine(containers))
    assert "participant-delta" in str(info.value)
    assert info.value.exit_code == 3


def test_a_service_that_stops_before_ready_fails_the_run(
    cfg: LensembleConfig, tmp_path: Path
) -> None:
    containers = healthy_stack(cfg)
    containers["participant-coastal"] = FakeContainer(
        [""], states=[RUNNING, ContainerState("exited", 2)]
    )
    with pytest.raises(StackFailed) as info:
        run_up(cfg, tmp_path, FakeEngine(containers))
    assert "participant-coastal stopped with exit code 2 before it was ready" in str(info.value)
    assert "logs participant-coastal" in info.value.remediation
    assert info.value.exit_code == 1


def test_ready_timeout_names_the_missing_services(cfg: LensembleConfig, tmp_path: Path) -> None:
    containers = healthy_stack(cfg)
    containers["participant-highland"] = FakeContainer([""])  # never ready, never exits
    with pytest.raises(StackFailed, match=r"participant-highland not ready after 30 s"):
        run_up(cfg, tmp_path, FakeEngine(containers), ready_timeout_s=30)


@pytest.mark.parametrize(("code", "expected"), [(1, 1), (3, 3), (137, 1)])
def test_coordinator_failure_is_the_exit_code(
    cfg: LensembleConfig, tmp_path: Path, code: int, expected: int
) -> None:
    with pytest.raises(StackFailed) as info:
        run_up(cfg, tmp_path, FakeEngine(healthy_stack(cfg, coordinator_exit=code)))
    assert f"coordinator exited with code {code}" in str(info.value)
    assert info.value.exit_code == expected


def test_a_restarted_coordinator_is_followed_again(cfg: LensembleConfig, tmp_path: Path) -> None:
    containers = healthy_stack(cfg)
    coordinator = containers["coordinator"]
    coordinator.states = [RUNNING, ContainerState("restarting", 1), ContainerState("exited", 0)]
    coordinator.logs.append([json.dumps({"round": 3, "message": "resumed from checkpoint"})])
    engine = FakeEngine(containers)
    out, _ = run_up(cfg, tmp_path, engine)
    assert engine.calls[-2:] == [("follow", "coordinator", False), ("follow", "coordinator", True)]
    assert "round 3: resumed from checkpoint" in out


def test_ready_waits_for_a_healthy_container(cfg: LensembleConfig, tmp_path: Path) -> None:
    containers = healthy_stack(cfg)
    starting, healthy = (
        ContainerState("running", 0, "starting"),
        ContainerState("running", 0, "healthy"),
    )
    containers["participant-alpine"].states = [starting, starting, starting, healthy]
    out, clock = run_up(cfg, tmp_path, FakeEngine(containers))
    assert "ready: participant-alpine (alpine:0), healthy" in out
    assert clock.now >= 3  # three looks saw it still starting


def test_a_failing_healthcheck_is_said_once_and_may_still_pass(
    cfg: LensembleConfig, tmp_path: Path
) -> None:
    containers = healthy_stack(cfg)
    sick, well = ContainerState("running", 0, "unhealthy"), ContainerState("running", 0, "healthy")
    containers["participant-delta"].states = [sick] * 6 + [
        well
    ]  # some looks precede its ready line
    out, _ = run_up(cfg, tmp_path, FakeEngine(containers))
    assert (
        out.count("participant-delta is ready but its healthcheck fails; waiting for it to pass")
        == 1
    )
    assert "ready: participant-delta (delta:0), healthy" in out


def test_a_healthcheck_that_never_passes_is_named_at_the_deadline(
    cfg: LensembleConfig, tmp_path: Path
) -> None:
    containers = healthy_stack(cfg)
    containers["participant-delta"].states = [ContainerState("running", 0, "unhealthy")]
    with pytest.raises(
        StackFailed,
        match=r"participant-delta not ready after 20 s \(participant-delta: healthcheck failing\)",
    ):
        run_up(cfg, tmp_path, FakeEngine(containers), ready_timeout_s=20)


def test_a_missing_local_image_is_named_before_anything_starts(
    cfg: LensembleConfig, tmp_path: Path
) -> None:
    engine = FakeEngine(healthy_stack(cfg), images=())
    with pytest.raises(StackFailed) as info:
        run_up(cfg, tmp_path, engine)
    assert "lensemble:0.1.0-cpu is not on this Docker engine" in str(info.value)
    assert "lensemble image build" in info.value.remediation
    assert engine.calls == []
    assert not (tmp_path / RECORD_NAME).exists()  # nothing to tear down


def test_a_finished_run_copies_the_ledger_and_reports_the_final_hash(
    cfg: LensembleConfig, tmp_path: Path
) -> None:
    lines = [
        {"round": 0, "state": "closed", "model_hash": "sha256:aa"},
        {"round": 1, "state": "aborted", "model_hash": "sha256:aa"},
        {"round": 1, "state": "closed", "model_hash": "sha256:bb"},
    ]
    # Ledger v2 lines wrap each round record with its chain fields (docs/run-record.md).
    wrapped = [
        {"ledger": "lensemble-ledger-v2", "seq": i, "record": r} for i, r in enumerate(lines)
    ]
    ledger = "".join(json.dumps(line) + "\n" for line in wrapped).encode() + b"{torn"
    engine = FakeEngine(
        healthy_stack(cfg), files={("coordinator", "/var/lib/lensemble/ledger.jsonl"): ledger}
    )
    out: list[str] = []
    result = up_compose(
        cfg,
        stack_dir=tmp_path,
        profile="cpu",
        command=["fake-compose"],
        engine_factory=lambda record: engine,
        make_certs=make_fake_certs,
        echo=out.append,
        clock=FakeClock(),
        sleep=lambda s: None,
    )
    assert result.model_hashes == ["sha256:aa", "sha256:bb"]
    assert result.ledger == tmp_path / "ledger.jsonl"
    assert result.ledger.read_bytes() == ledger
    assert "final model sha256:bb after 2 committed rounds" in out[-1]


# --------------------------------------------------------------------------------- down
def test_down_tears_down_exactly_once(cfg: LensembleConfig, tmp_path: Path) -> None:
    engine = FakeEngine(healthy_stack(cfg))
    run_up(cfg, tmp_path, engine)
    out: list[str] = []
    assert down_compose(tmp_path, engine_factory=lambda r: engine, echo=out.append) is True
    assert engine.calls[-1] == ("down", False)
    assert not (tmp_path / RECORD_NAME).exists()

    def must_not_build(record: StackRecord) -> FakeEngine:
        raise AssertionError("a second down must not touch the engine")

    assert down_compose(tmp_path, engine_factory=must_not_build, echo=out.append) is False
    assert out[-1].startswith("nothing to tear down")
    assert engine.calls.count(("down", False)) == 1


def test_a_failed_start_is_still_torn_down(cfg: LensembleConfig, tmp_path: Path) -> None:
    engine = FakeEngine(healthy_stack(cfg), up_error=StackFailed("image not found"))
    with pytest.raises(StackFailed, match="image not found"):
        run_up(cfg, tmp_path, engine)
    assert down_compose(
        tmp_path, volumes=True, engine_factory=lambda r: engine, echo=lambda s: None
    )
    assert engine.calls == ["create", ("down", True)]


class FinishedRunEngine(FakeEngine):
    """The coordinator's volume holds a finished run: it exits 0 at once, the start fails."""

    def start(self, *, timeout_s: float, echo: Any) -> None:
        self.calls.append("start")
        self.started = True
        raise StackFailed("Could not start the Compose project 'lensemble-local'")


@pytest.mark.parametrize("coordinator", ["finished", "failed", "running"])
def test_a_start_that_failed_because_the_coordinator_exited_says_why(
    coordinator: str, cfg: LensembleConfig, tmp_path: Path
) -> None:
    """A field report: after `down` (volumes kept), a second `up` failed with Compose's words."""
    containers = healthy_stack(cfg)
    error = "error: <config>: federation.masking: unknown key 'masking'."  # an older image
    containers["coordinator"] = {
        "finished": FakeContainer(
            [""],  # the ready line aside, a coordinator logs on stderr: `follow` has both
            [ContainerState("exited", 0)],
            logs=[[json.dumps({"message": "all rounds committed; participants may leave."})]],
        ),
        "failed": FakeContainer([""], [ContainerState("exited", 2)], logs=[[error]]),
        "running": FakeContainer([""], [RUNNING]),
    }[coordinator]
    engine = FinishedRunEngine(containers)
    with pytest.raises(StackFailed) as failed:
        run_up(cfg, tmp_path, engine)
    if coordinator == "finished":
        assert "already holds a finished run" in str(failed.value)
        assert "lensemble down --volumes" in failed.value.remediation
        assert engine.calls[-1] == ("down", False) and not (tmp_path / RECORD_NAME).exists()
        return
    assert ("down", False) not in engine.calls and (tmp_path / RECORD_NAME).exists()
    if coordinator == "failed":  # its own exit code and error line, passed through
        assert "coordinator stopped with exit code 2" in str(failed.value)
        assert "unknown key" in str(failed.value) and failed.value.exit_code == 2
    else:  # another cause: Compose's own words
        assert "Could not start" in str(failed.value)


def test_a_failed_teardown_keeps_the_record(cfg: LensembleConfig, tmp_path: Path) -> None:
    run_up(cfg, tmp_path, FakeEngine(healthy_stack(cfg)))

    class Broken(FakeEngine):
        def down(self, *, volumes: bool) -> None:
            raise StackFailed("engine gone")

    with pytest.raises(StackFailed):
        down_compose(tmp_path, engine_factory=lambda r: Broken({}), echo=lambda s: None)
    assert (tmp_path / RECORD_NAME).exists()


def test_a_corrupt_record_is_reported(tmp_path: Path) -> None:
    (tmp_path / RECORD_NAME).write_text("{not json")
    with pytest.raises(UsageError, match="not a stack record"):
        down_compose(tmp_path, engine_factory=lambda r: FakeEngine({}), echo=lambda s: None)


# -------------------------------------------------------------------------------- certs
def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_certs_are_created_and_shared_with_the_container_user(
    cfg: LensembleConfig, tmp_path: Path
) -> None:
    run_up(cfg, tmp_path, FakeEngine(healthy_stack(cfg)))
    certs = tmp_path / "certs"
    assert mode(certs) == 0o700  # other host users cannot reach any key
    assert mode(certs / "ca.key") == 0o600  # the CA key is never mounted, never opened up
    for identity in ["coordinator", *cfg.participant_ids]:
        assert mode(certs / identity) == 0o755
        assert mode(certs / identity / "tls.key") == 0o644  # readable by UID 10001


def test_existing_certs_are_kept(cfg: LensembleConfig, tmp_path: Path) -> None:
    identities = ["coordinator", *cfg.participant_ids]
    config_file = tmp_path / "lensemble.yaml"
    config_file.write_text((REPO / "compose/lensemble.yaml").read_text())
    make_fake_certs(tmp_path / "certs", config_file)
    prepare_certs(tmp_path / "certs", config_file, identities, no_certs)
    assert mode(tmp_path / "certs" / "alpine" / "tls.crt") == 0o644


def test_partial_certs_are_refused(cfg: LensembleConfig, tmp_path: Path) -> None:
    (tmp_path / "certs" / "coordinator").mkdir(parents=True)
    (tmp_path / "certs" / "coordinator" / "tls.crt").write_text("x")
    with pytest.raises(StackFailed, match="no certificates for alpine"):
        prepare_certs(tmp_path / "certs", tmp_path / "c.yaml", ["coordinator", "alpine"], no_certs)


def test_certs_init_that_writes_nothing_is_reported(tmp_path: Path) -> None:
    with pytest.raises(StackFailed, match="left no certificate for coordinator"):
        prepare_certs(tmp_path / "certs", tmp_path / "c.yaml", ["coordinator"], lambda d, c: None)


# ------------------------------------------------------------------------------ progress
@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"round": 4, "message": "committed", "level": "INFO"}', "round 4: committed"),
        ('{"round": 4, "event": "round_aborted"}', "round 4: round_aborted"),
        ('{"round": 4, "message": "round 4 attempt 0 committed"}', "round 4 attempt 0 committed"),
        ('{"round": 5, "attempt": 0, "state": "closed", "model_hash": "ab"}', "round 5: closed"),
        ('{"level": "ERROR", "message": "quorum lost"}', "coordinator error: quorum lost"),
        ('{"level": "INFO", "message": "listening"}', None),
        ("plain text", None),
        ("7", None),
    ],
)
def test_round_progress(line: str, expected: str | None) -> None:
    assert round_progress(line) == expected


# ----------------------------------------------------------------------- docker engine
class Recorder:
    def __init__(self, returncode: int = 0, stdout: str = "", stderr: str = "") -> None:
        self.args: list[list[str]] = []
        self.kwargs: list[dict[str, Any]] = []
        self.result = (returncode, stdout, stderr)

    def __call__(self, args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        self.args.append(list(args))
        self.kwargs.append(kwargs)
        code, out, err = self.result
        return subprocess.CompletedProcess(args, code, out, err)


def test_docker_engine_commands(tmp_path: Path) -> None:
    run = Recorder(stdout="abc123\n")
    engine = DockerComposeEngine(
        ["docker", "compose"], project="p", compose_file=tmp_path / "c.yaml", profile="gpu", run=run
    )
    engine.create(timeout_s=120, echo=print)
    engine.start(timeout_s=30, echo=print)
    assert engine.container("coordinator") == "abc123"
    engine.down(volumes=True)
    prefix = ["docker", "compose", "-p", "p", "-f", str(tmp_path / "c.yaml"), "--profile", "gpu"]
    assert run.args == [
        [*prefix, "up", "--no-start"],
        [*prefix, "up", "-d"],
        [*prefix, "ps", "-a", "-q", "coordinator"],
        [*prefix, "--profile", "monitoring", "down", "--remove-orphans", "--volumes"],
    ]
    # Our deadline, not docker-compose 1.x's 60 s HTTP timeout, bounds a slow create.
    assert [kw["env"]["COMPOSE_HTTP_TIMEOUT"] for kw in run.kwargs[:2]] == ["120", "30"]
    assert [kw["timeout"] for kw in run.kwargs[:2]] == [120, 30]
    run.result = (0, "restarting 137 2 unhealthy\n", "")
    assert engine.state("abc123") == ContainerState("restarting", 137, "unhealthy", 2)
    assert not engine.state("abc123").finished
    run.result = (0, "exited 0 0 \n", "")
    assert engine.state("abc123") == ContainerState("exited", 0, "", 0)


def test_a_slow_create_names_the_step_and_the_fix(tmp_path: Path) -> None:
    def slow(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        raise subprocess.TimeoutExpired(args, kwargs["timeout"])

    engine = DockerComposeEngine(
        ["docker-compose"], project="p", compose_file=tmp_path / "c.yaml", profile="cpu", run=slow
    )
    with pytest.raises(StackFailed) as info:
        engine.create(timeout_s=5, echo=print)
    assert "did not finish within 5 s (create the containers of the Compose project 'p')" in str(
        info.value
    )
    assert "--start-timeout" in info.value.remediation


def test_docker_engine_failures_are_one_sentence(tmp_path: Path) -> None:
    run = Recorder(returncode=1, stderr="pulling...\nError: pull access denied for lensemble\n")
    engine = DockerComposeEngine(
        ["docker-compose"], project="p", compose_file=tmp_path / "c.yaml", profile="cpu", run=run
    )
    with pytest.raises(StackFailed) as info:
        engine.start(timeout_s=60, echo=print)
    assert str(info.value).startswith(
        "Could not start the Compose project 'p': Error: pull access denied"
    )

    def missing(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError(args[0])

    engine = DockerComposeEngine(
        ["docker-compose"],
        project="p",
        compose_file=tmp_path / "c.yaml",
        profile="cpu",
        run=missing,
    )
    with pytest.raises(ToolMissing):
        engine.create(timeout_s=60, echo=print)


def test_compose_command_prefers_v2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    assert compose_command(Recorder(returncode=0)) == ["docker", "compose"]
    assert compose_command(Recorder(returncode=1)) == ["docker-compose"]
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(ToolMissing, match="docker-compose"):
        compose_command(Recorder())


# ---------------------------------------------------------------------------------- CLI
def test_cli_down_with_nothing_up(tmp_path: Path, in_repo: Path) -> None:
    result = run_cli("down", "--dir", str(tmp_path))
    assert result.code == 0, result.err
    assert "nothing to tear down" in result.out


def test_cli_up_without_a_docker_engine_exits_4(
    tmp_path: Path, in_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An engine address where none answers, whether or not this machine runs one.
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    result = run_cli(
        "up",
        "--substrate",
        "compose",
        "--config",
        "config/local.yaml",
        "--set",
        "federation.transport=network",
        "--dir",
        str(tmp_path),
    )
    assert result.code == 4, result.err
    assert result.err.startswith("error: ")
    assert "Traceback" not in result.err
    assert not (tmp_path / RECORD_NAME).exists()


def test_a_coordinator_refusing_a_broken_record_is_named_with_its_exit_code(
    cfg: LensembleConfig, tmp_path: Path
) -> None:
    # The coordinator verifies its run record before any network I/O and exits 3 with one
    # sentence; `up` quotes that sentence and passes the code through.
    said = (
        "error: the run record in /var/lib/lensemble is broken at /var/lib/lensemble/ledger."
        "jsonl:4: was edited (expected sha256:aa, found sha256:bb); nothing was trained"
    )
    containers = healthy_stack(cfg)
    containers["coordinator"] = FakeContainer(
        [""],
        states=[RUNNING, ContainerState("exited", 3)],
        logs=[["starting", said, "a later line that is not an error"]],
    )
    with pytest.raises(StackFailed) as info:
        run_up(cfg, tmp_path, FakeEngine(containers))
    assert info.value.exit_code == 3
    assert "coordinator stopped with exit code 3 before it was ready: the run record" in str(
        info.value
    )
    assert "ledger.jsonl:4: was edited" in str(info.value)
