"""The README's and how-to pages' commands run as written (issue 41, items 11 and 12).

Every ``bash`` block of ``README.md`` and ``docs/how-to/*.md`` is run by bash, line by line as
a reader would paste it, in a scratch folder holding a copy of ``config/`` and ``compose/`` (so
``runs/...`` lands there, never in the checkout). Its short form shortens each ``lensemble``
command: ``simulate`` with at most 3 rounds (enough for the faults it names), ``coordinator``
and ``participant`` with 2 rounds and free ports for the coordinator's gRPC and download ports
(what the page says to do when the defaults are taken). Commands of other programs (pip, helm,
docker, kind, pulumi, the checkout's tools) and ``lensemble`` commands that need a container
engine are not run here: each is named in :data:`ELSEWHERE` with the tests that cover it, and a
command neither runnable nor named there fails this test, so a new documented command gets a
short form or a reason.

Every run (about a minute on 2 cores) parses every documented ``lensemble`` command with the
CLI itself and loads its config with its ``--set`` flags (a renamed flag, a moved file or a
field that no longer validates fails here), and runs the short form of every block but those
in :data:`FULL_TIER_ONLY`, which hold a dozen whole runs between them. Those in short form, and
every block as written, run in the full tier (marked ``full`` and ``slow``:
``LENSEMBLE_FULL_SUITES=1``, docs/testing.md).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command

from lensemble.cli import app
from lensemble.config import default_config_path, load_config
from lensemble.network.launch.launcher import free_port
from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs" / "how-to").glob("*.md"))]
BLOCK = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)

#: Shell words a block may use around its commands (run as they are).
SHELL = {"export", "for", "done", "wait", "chmod", "do"}
#: Programs and ``lensemble`` commands not run here, and where they are covered instead.
ELSEWHERE = {
    "pip": "installs packages (tests/install)",
    "python": "checkout tools (python -m tools.*): tests/vendor, tests/k8s, test_generated.py",
    "ruff": "the lint gate (CI)",
    "mypy": "the type gate (CI)",
    "lint-imports": "the import contracts (CI)",
    "pytest": "this test suite",
    "helm": "Helm itself (tests/k8s with helm)",
    "kind": "a kind cluster (tests marked kind)",
    "docker": "a container engine (tests marked docker)",
    "kubectl": "a cluster (tests marked kind)",
    "pulumi": "Pulumi (tests/infra under mocks)",
    "lensemble up": "a container engine (tests/compose/test_engine_e2e.py, marked docker)",
    "lensemble down": "a container engine (tests/compose/test_engine_e2e.py, marked docker)",
    "lensemble image": "a container engine (tests/image, marked docker)",
    "lensemble render k8s": "Helm's library and kubectl (tests/k8s)",
}
#: Where a block runs, when not at the scratch folder's root: (page, block index) -> folder.
CWD = {("compose.md", 1): "compose"}
#: Blocks that cannot run on one host, and where they are covered instead.
NOT_HERE = {
    ("network.md", 2): "needs a second host: tests/network/test_multihost.py (netns) runs the "
    "processes on separate network stacks; the one-host block runs the same commands",
}
#: What a block's short form must print on stdout (a run by hand whose processes failed would
#: still leave a valid, shorter record).
EXPECT = {("network.md", 1): "2 rounds committed"}
#: Blocks whose short form runs in the full tier only, with what every run has instead: each
#: holds whole runs, together two to three minutes on 2 cores. Every run still parses their
#: commands and loads their configs.
FULL_TIER_ONLY = {
    ("README.md", 2): "three simulate runs (8 participants, faults, the network transport); "
    "the default simulate runs from README.md#0",
    ("simulate.md", 0): "seven simulate runs (8 participants, int8, faults, a resume, --json); "
    "tests/e2e/test_simulate.py runs faults and a resume, tests/simulation/test_option_sweep.py "
    "every option value",
    ("network.md", 0): "simulate over the network transport (tests/network/"
    "test_local_processes.py); lensemble verify runs in network.md#1, processes by hand",
}
#: How long a block may take (seconds) before its processes are killed: short form, as written.
TIMEOUT_S = {"short": 900, "full": 3600}


@dataclass(frozen=True)
class Block:
    """One ``bash`` block of a page: its commands, one logical line each."""

    page: Path
    index: int
    lines: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.page.name}#{self.index}"


def _uncommented(line: str) -> str:
    """``line`` without a comment (a ``#`` after a blank, outside quotes)."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _logical_lines(text: str) -> list[str]:
    """The block's commands: continuations and quoted line breaks joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in re.sub(r"\\\n\s*", " ", text).splitlines():
        if not pending and raw.lstrip().startswith("#"):
            continue
        pending = f"{pending}\n{raw}" if pending else raw
        line = _uncommented(pending)
        if line.count("'") % 2:  # a quoted value goes on (export NET='... newline ...')
            continue
        pending = ""
        if line.strip():
            lines.append(line)
    return lines


def _blocks() -> list[Block]:
    blocks = []
    for page in PAGES:
        for index, body in enumerate(BLOCK.findall(page.read_text(encoding="utf-8"))):
            blocks.append(Block(page, index, tuple(_logical_lines(body))))
    return blocks


def _commands(line: str) -> list[str]:
    """The commands of a line: ``&&``-chained ones apart, a trailing ``&`` kept."""
    return [part.strip() for part in line.split("&&") if part.strip()]


def _kind(command: str) -> str:
    """``lensemble <sub>``, a shell word, or the program the command runs."""
    words = command.replace("&", " ").split()
    if words[0] == "lensemble":
        sub = " ".join(words[:2])
        return "lensemble render k8s" if words[1:3] == ["render", "k8s"] else sub
    return words[0]


def _skipped(kind: str) -> str | None:
    if kind in SHELL or kind.startswith("lensemble"):
        return ELSEWHERE.get(kind)
    return ELSEWHERE.get(kind, f"not runnable here and not in ELSEWHERE: {kind}")


def _short(command: str, ports: tuple[int, int]) -> str:
    """The command's short form: few rounds, free coordinator ports."""
    words = command.split()
    if words[:2] == ["lensemble", "simulate"]:
        rounds = re.search(r"(?:-r|--rounds)\s+(\d+)", command)
        faulted = [int(r) for r in re.findall(r"@(\d+)", command)]
        few = 2 if rounds is None or int(rounds.group(1)) <= 10 else 3
        wanted = max([few, *(r + 1 for r in faulted)])
        command = re.sub(r"\s(?:-r|--rounds)\s+\d+", "", command)
        return _before_amp(command, f"--rounds {wanted}")
    if words[:2] in (["lensemble", "coordinator"], ["lensemble", "participant"]):
        return _with_ports(_before_amp(command, "--set federation.rounds=2"), ports)
    return command


def _full(command: str, ports: tuple[int, int]) -> str:
    """The command as written; processes by hand still get free coordinator ports."""
    if command.split()[:2] in (["lensemble", "coordinator"], ["lensemble", "participant"]):
        return _with_ports(command, ports)
    return command


def _before_amp(command: str, extra: str) -> str:
    body, amp = (command[:-1].rstrip(), " &") if command.endswith("&") else (command, "")
    return f"{body} {extra}{amp}"


def _with_ports(command: str, ports: tuple[int, int]) -> str:
    sets = f"--set network.port={ports[0]} --set network.download_port={ports[1]}"
    return _before_amp(command, sets)


def _script(block: Block, form: str) -> tuple[str, list[str]]:
    """The bash script of ``block`` in ``form`` (short or full), and what it leaves out."""
    ports = (free_port(), free_port())
    kept, left_out = [], []
    for line in block.lines:
        commands = _commands(line)
        reasons = [_skipped(_kind(c)) for c in commands]
        unknown = [r for r in reasons if r and r.startswith("not runnable")]
        assert not unknown, f"{block.id}: {unknown[0]}; give it a short form or a reason"
        if any(reasons):
            left_out += [c for c, r in zip(commands, reasons, strict=True) if r]
            runnable = [c for c, r in zip(commands, reasons, strict=True) if not r]
            if not runnable:
                continue
            line = " && ".join(runnable)
        shaped = [(_short if form == "short" else _full)(c, ports) for c in _commands(line)]
        kept.append(" && ".join(shaped))
    return "set -euo pipefail\n" + "\n".join(kept) + "\n", left_out


BLOCKS = [
    b
    for b in _blocks()
    if (b.page.name, b.index) not in NOT_HERE
    and any(
        _kind(c).startswith("lensemble") and not _skipped(_kind(c))
        for line in b.lines
        for c in _commands(line)
    )
]


def _scratch(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "config", tmp_path / "config")
    shutil.copytree(REPO / "compose", tmp_path / "compose")
    return tmp_path


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def _left_in_a_checkout(root: Path, before: set[str]) -> list[str]:
    """Files a block wrote that a checkout's ``git status`` would show (not ignored there)."""
    new = sorted(_files(root) - before)
    if not new:
        return []
    ignored = subprocess.run(
        ["git", "-C", str(REPO), "check-ignore", "--no-index", "--stdin"],
        input="\n".join(new),
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    return [path for path in new if path not in ignored]


def _run(block: Block, form: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run ``block``'s script in ``form``; its processes (started with ``&`` too) end with it.

    Raises:
        AssertionError: The block wrote a file that a checkout would show as untracked (a
            page's command must write under ``runs/`` or another ignored folder).
    """
    script, _ = _script(block, form)
    root = _scratch(tmp_path)
    before = _files(root)
    cwd = root / CWD.get((block.page.name, block.index), "")
    env = {**os.environ, "PYTHONPATH": str(REPO / "runtime")}
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S[form])
    finally:
        # A failed or timed-out block may leave background processes behind.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    stray = _left_in_a_checkout(root, before)
    assert not stray, f"{block.id} writes into the checkout: {stray[:5]}; write under runs/"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _bindings(block: Block) -> dict[str, str]:
    """The block's shell variables: ``export NAME='...'`` and a ``for`` loop's first value."""
    found: dict[str, str] = {}
    for line in block.lines:
        if m := re.match(r"export (\w+)=(.*)$", line.strip(), re.DOTALL):
            found[m[1]] = " ".join(shlex.split(m[2]))
        elif m := re.match(r"for (\w+) in (\S+)", line.strip()):
            found[m[1]] = m[2]
    return found


def _argv(command: str, bindings: dict[str, str]) -> list[str]:
    """A ``lensemble`` command's arguments (after ``lensemble``), its variables expanded."""
    command = re.sub(r"\$(\w+)", lambda m: bindings[m[1]], command).rstrip("&").strip()
    words = shlex.split(command)
    assert words[0] == "lensemble", command
    return words[1:]


def _parsed(argv: list[str]) -> Any:
    """The Click context of the CLI's own parse of ``argv`` (raises on what it refuses)."""
    ctx = get_command(app).make_context("lensemble", list(argv))
    while hasattr(ctx.command, "resolve_command"):  # a command group: on to its subcommand
        name, sub, rest = ctx.command.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        ctx = sub.make_context(name, rest, parent=ctx)
    return ctx


def _check_command(argv: list[str]) -> None:
    """Parse ``lensemble ARGV`` and load its config with its overrides, as the command would.

    ``simulate`` also builds its overrides (``-n``, ``-r``, ``-o``) and checks its fault plan
    the way the command does before any work.
    """
    from lensemble.cli import simulate_cmd
    from lensemble.federation.faults import parse_faults

    ctx = _parsed(argv)
    params = ctx.params
    if "set_" not in params:  # the command takes no config
        return
    path = params.get("config") or params.get("file") or default_config_path()
    overrides = list(params["set_"] or [])
    if ctx.info_name == "simulate":
        overrides = simulate_cmd._overrides(
            params["set_"], params["participants"], params["rounds"], params["output_dir"]
        )
    cfg = load_config(path, overrides)
    if params.get("faults"):
        plan = parse_faults(params["faults"], cfg.participant_ids)
        if ctx.info_name == "simulate":
            simulate_cmd._check_faults(cfg, plan)


def test_every_documented_command_is_run_or_says_where_it_is_covered() -> None:
    seen = set()
    for block in _blocks():
        for line in block.lines:
            for command in _commands(line):
                kind = _kind(command)
                reason = _skipped(kind)
                assert reason is None or not reason.startswith("not runnable"), (block.id, kind)
                seen.add(kind)
    # The pages name the commands this test runs (a page rewrite must not drop them unseen).
    assert {"lensemble simulate", "lensemble verify", "lensemble coordinator"} <= seen
    assert len(BLOCKS) >= 6


def test_every_documented_lensemble_command_parses_and_loads_its_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checked = 0
    for block in _blocks():
        monkeypatch.chdir(REPO / CWD.get((block.page.name, block.index), ""))
        bindings = _bindings(block)
        for line in block.lines:
            for command in _commands(line):
                if not _kind(command).startswith("lensemble"):
                    continue
                try:
                    _check_command(_argv(command, bindings))
                except Exception as exc:
                    pytest.fail(f"{block.id}: `{command}`: {exc}")
                checked += 1
    assert checked >= 20


def test_the_command_check_refuses_what_the_cli_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    _check_command(["simulate", "-r", "4", "--faults", "drop:alpine@3"])
    refused = [
        ["simulate", "--roundz", "3"],  # a renamed flag
        ["render", "compose", "--config", "config/gone.yaml"],  # a moved file
        ["config", "validate", "config/local.yaml", "--set", "federation.nonexist=1"],
        ["simulate", "-r", "3", "--faults", "drop:alpine@3"],  # a fault past the run
        ["simulate", "--faults", "drop:nobody@1"],
    ]
    for argv in refused:
        # Click's usage errors, ConfigError or UsageError: whatever the command itself raises.
        with pytest.raises(Exception):
            _check_command(argv)


def _short_params() -> list[Any]:
    marks = [pytest.mark.slow, pytest.mark.full]
    return [
        pytest.param(b, id=b.id, marks=marks if (b.page.name, b.index) in FULL_TIER_ONLY else [])
        for b in BLOCKS
    ]


@pytest.mark.parametrize("block", _short_params())
def test_documented_commands_run_in_short_form(block: Block, tmp_path: Path) -> None:
    done = _run(block, "short", tmp_path)
    script, _ = _script(block, "short")
    assert done.returncode == 0, f"{script}\n--- stderr:\n{done.stderr[-3000:]}"
    assert EXPECT.get((block.page.name, block.index), "") in done.stdout, done.stdout[-2000:]


@pytest.mark.slow
@pytest.mark.full
@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_documented_commands_run_as_written(block: Block, tmp_path: Path) -> None:
    done = _run(block, "full", tmp_path)
    script, _ = _script(block, "full")
    assert done.returncode == 0, f"{script}\n--- stderr:\n{done.stderr[-3000:]}"


def test_the_short_forms_shorten() -> None:
    ports = (1, 2)
    assert _short("lensemble simulate -n 8 -r 30 -o runs/eight", ports).endswith("--rounds 3")
    assert "--rounds 6" in _short("lensemble simulate --faults 'drop:coastal@5'", ports)
    assert _short("lensemble participant --id a &", ports).endswith(
        "--set network.port=1 --set network.download_port=2 &"
    )
    assert shlex.split(_short("lensemble simulate -r 10 -o runs/a", ports))[-2:] == [
        "--rounds",
        "2",
    ]
