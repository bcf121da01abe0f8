"""Start a coordinator and its participants as local processes, and tear them down once.

Used by ``lensemble simulate --set federation.transport=network`` and by the tests. Each child:

- runs a ``lensemble`` command (or any program taking the same arguments) with ``--set``
  overrides: JSON logs, free ports (``--health-port 0 --metrics-port 0``; the ready line reports
  them);
- dies with its parent: ``PR_SET_PDEATHSIG`` (set by a tiny exec wrapper) makes the kernel send
  it ``SIGKILL`` when the thread that started it ends, so a crashed launcher leaves no orphan;
- has its stdout read for exactly one ready line, and its stderr copied to
  ``<logs>/<identity>.log`` while its JSON events are kept for whoever follows the run.

:meth:`LocalFederation.close` stops every child still running (``SIGTERM``, then ``SIGKILL``
after a grace period) and runs exactly once, however it is reached.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lensemble.errors import LensembleError, RoundError
from lensemble.network.shared.identity import COORDINATOR_IDENTITY

#: The ``lensemble`` CLI as a program prefix (no dependence on PATH).
LENSEMBLE_PROGRAM = (sys.executable, "-c", "from lensemble.cli import main; main()")
_PR_SET_PDEATHSIG = 1


#: Runs first in every child: ask for SIGKILL when the parent dies, give up if it already did,
#: then exec the real command. (A ``preexec_fn`` would do the same, but it forces a plain fork()
#: of the parent, and gRPC's fork handlers in a parent with live channels can abort the child.)
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    f"ctypes.CDLL(None).prctl({_PR_SET_PDEATHSIG}, signal.SIGKILL, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def die_with_parent(argv: Sequence[str]) -> list[str]:
    """``argv`` wrapped so that the child gets SIGKILL when this process's current thread ends."""
    return [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]


#: Where the kernel says its ephemeral ports (those of outgoing connections) lie.
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: The lowest port :func:`free_port` picks below the ephemeral range.
LOWEST_PICKED_PORT = 10_000


def _below_ephemeral() -> range | None:
    """Ports under the kernel's ephemeral range (None when it cannot be read or leaves none)."""
    try:
        low = int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return range(LOWEST_PICKED_PORT, low) if low - LOWEST_PICKED_PORT >= 1000 else None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host`` (for ports every child must know).

    Picked at random below the kernel's ephemeral range where there is one, so that no
    outgoing connection (of this process or any other) can be handed the port between this
    call and the child's bind; port 0's choice, inside that range, could be.
    """
    candidates = _below_ephemeral()
    for _ in range(64 if candidates is not None else 0):
        port = random.choice(candidates)  # type: ignore[arg-type]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ProcessFailed(LensembleError):
    """A child process exited or never became ready."""

    code = "process_failed"


#: Longest wait for an exited child's stderr to be read to its end (seconds).
STDERR_DRAIN_S = 5.0


class ManagedProcess:
    """One child process: its ready line, its JSON events, its log file.

    Args:
        identity: ``coordinator`` or the participant id.
        argv: Full command line.
        log_path: Where stderr is copied.
        env: Environment of the child.
        cwd: Working directory.
    """

    def __init__(
        self,
        identity: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str],
        cwd: Path | None = None,
    ) -> None:
        self.identity = identity
        self.argv = list(argv)
        self.log_path = log_path
        self.ready: dict[str, Any] | None = None
        self.events: list[dict[str, Any]] = []
        self.tail: list[str] = []
        self._cond = threading.Condition()
        self._stdout_done = False
        self._stderr_done = False
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.popen = subprocess.Popen(
            die_with_parent(self.argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )
        threading.Thread(target=self._read_stdout, name=f"{identity}-stdout", daemon=True).start()
        threading.Thread(target=self._read_stderr, name=f"{identity}-stderr", daemon=True).start()

    def _read_stdout(self) -> None:
        assert self.popen.stdout is not None
        first = self.popen.stdout.readline()
        with self._cond:
            if first:
                try:
                    parsed = json.loads(first)
                except ValueError:
                    parsed = {"event": "not-ready", "line": first.decode(errors="replace")}
                self.ready = parsed if isinstance(parsed, dict) else {"event": "not-ready"}
            self._stdout_done = True
            self._cond.notify_all()
        self.popen.stdout.read()  # anything after the ready line would break the contract

    def _read_stderr(self) -> None:
        assert self.popen.stderr is not None
        with self.log_path.open("ab") as log:
            for raw in self.popen.stderr:
                log.write(raw)
                log.flush()
                line = raw.decode(errors="replace").rstrip("\n")
                parsed: Any = None
                if line.startswith("{"):
                    try:
                        parsed = json.loads(line)
                    except ValueError:
                        parsed = None
                with self._cond:
                    self.tail = [*self.tail[-19:], line]
                    if isinstance(parsed, dict) and parsed.get("event"):
                        self.events.append(parsed)
                    self._cond.notify_all()
        with self._cond:
            self._stderr_done = True
            self._cond.notify_all()

    @property
    def returncode(self) -> int | None:
        """Exit code, or None while running."""
        return self.popen.poll()

    def last_error(self) -> str:
        """The most telling recent stderr line (an error or warning), for one-line reports."""
        with self._cond:
            if self.popen.poll() is not None:
                # An exited child's last lines may still be in the pipe: let the reader drain it.
                self._cond.wait_for(lambda: self._stderr_done, timeout=STDERR_DRAIN_S)
            lines = list(self.tail)
        for line in reversed(lines):
            try:
                parsed = json.loads(line)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                if parsed.get("level") in ("ERROR", "CRITICAL"):
                    return str(parsed.get("message", line))
                continue
            if line.startswith(("error:", "fix:")) or "Error" in line:
                return line
        return lines[-1] if lines else "(no output)"

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        """Block until the ready line arrives.

        Raises:
            ProcessFailed: The process exited, printed something else first, or timed out.
        """
        end = time.monotonic() + timeout_s
        with self._cond:
            while not self._stdout_done and time.monotonic() < end:
                self._cond.wait(0.1)
            ready = self.ready
        if ready is None or ready.get("event") != "ready":
            code = self.popen.poll()
            if code is None and self._stdout_done:  # stdout closed without a ready line
                try:
                    code = self.popen.wait(5.0)
                except subprocess.TimeoutExpired:
                    code = None
            state = f"exited with code {code}" if code is not None else "is not ready"
            raise ProcessFailed(
                f"{self.identity} {state} after {timeout_s:.0f} s: {self.last_error()}",
                remediation=f"see {self.log_path}.",
            )
        return ready

    def all_events(self) -> list[dict[str, Any]]:
        """Every JSON event the process logged; after its exit, once its stderr is drained."""
        with self._cond:
            if self.popen.poll() is not None:
                self._cond.wait_for(lambda: self._stderr_done, timeout=STDERR_DRAIN_S)
            return list(self.events)

    def wait_event(
        self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float, start: int = 0
    ) -> dict[str, Any]:
        """The first event (from index ``start``) matching ``predicate``.

        Raises:
            ProcessFailed: The process exited first, or ``timeout_s`` passed.
        """
        end = time.monotonic() + timeout_s
        with self._cond:
            seen = start
            while True:
                for item in self.events[seen:]:
                    if predicate(item):
                        return item
                seen = len(self.events)
                if self.popen.poll() is not None and not self._stderr_open():
                    break
                if time.monotonic() >= end:
                    break
                self._cond.wait(0.1)
        raise ProcessFailed(
            f"{self.identity} did not log the expected event within {timeout_s:.0f} s "
            f"(exit code {self.popen.poll()}): {self.last_error()}",
            remediation=f"see {self.log_path}.",
        )

    def _stderr_open(self) -> bool:
        stream = self.popen.stderr
        return stream is not None and not stream.closed and self.popen.poll() is None

    def signal(self, signum: int) -> None:
        """Send a signal if the process still runs."""
        if self.popen.poll() is None:
            self.popen.send_signal(signum)

    def wait(self, timeout_s: float) -> int:
        """Wait for the exit code.

        Raises:
            subprocess.TimeoutExpired: Still running after ``timeout_s``.
        """
        return self.popen.wait(timeout_s)

    def stop(self, grace_s: float) -> int:
        """SIGTERM, then SIGKILL after ``grace_s``; returns the exit code."""
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait()


class LocalFederation:
    """A coordinator and participants as child processes on this machine.

    Args:
        config_path: The config file every child reads.
        overrides: ``--set`` overrides every child gets (the launcher adds its own after them).
        logs: Folder for ``<identity>.log``.
        program: Command prefix; children run ``program + [role, --config, ...]``.
        env: Extra environment for the children.
        cwd: Working directory of the children.
    """

    def __init__(
        self,
        config_path: Path,
        overrides: Sequence[str],
        logs: Path,
        *,
        program: Sequence[str] = LENSEMBLE_PROGRAM,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.config_path = config_path
        self.overrides = list(overrides)
        self.logs = logs
        self.program = list(program)
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.processes: dict[str, ManagedProcess] = {}
        self._closed = False
        self._lock = threading.Lock()
        self.teardowns = 0

    def _args(self, extra_overrides: Sequence[str]) -> list[str]:
        args = ["--config", str(self.config_path)]
        for item in [*self.overrides, *extra_overrides]:
            args += ["--set", item]
        return [*args, "--health-port", "0", "--metrics-port", "0"]

    def start_coordinator(
        self,
        extra_overrides: Sequence[str] = (),
        wrapper: Sequence[str] = (),
        extra_args: Sequence[str] = (),
    ) -> ManagedProcess:
        """Start (or restart) the coordinator.

        Args:
            extra_overrides: More ``--set`` overrides for this process.
            wrapper: Command prefix, e.g. ``ip netns exec NS``.
            extra_args: More arguments after the standard ones.
        """
        argv = [*wrapper, *self.program, "coordinator", *self._args(extra_overrides), *extra_args]
        return self._start(COORDINATOR_IDENTITY, argv)

    def start_participant(
        self,
        participant_id: str,
        extra_overrides: Sequence[str] = (),
        extra_args: Sequence[str] = (),
        wrapper: Sequence[str] = (),
    ) -> ManagedProcess:
        """Start (or restart) one participant.

        Args:
            participant_id: Its id.
            extra_overrides: More ``--set`` overrides for this process.
            extra_args: More arguments after the standard ones.
            wrapper: Command prefix, e.g. ``ip netns exec NS``.
        """
        argv = [
            *wrapper,
            *self.program,
            "participant",
            "--id",
            participant_id,
            *self._args(extra_overrides),
            *extra_args,
        ]
        return self._start(participant_id, argv)

    def _start(self, identity: str, argv: list[str]) -> ManagedProcess:
        with self._lock:
            if self._closed:
                raise RoundError("the local federation was already torn down.")
            old = self.processes.get(identity)
            if old is not None and old.returncode is None:
                raise RoundError(f"{identity} is still running; stop it before restarting.")
            proc = ManagedProcess(identity, argv, self.logs / f"{identity}.log", self.env, self.cwd)
            self.processes[identity] = proc
            return proc

    def __getitem__(self, identity: str) -> ManagedProcess:
        return self.processes[identity]

    def close(self, grace_s: float = 10.0) -> None:
        """Stop every child still running; idempotent, the teardown happens exactly once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.teardowns += 1
            running = [p for p in self.processes.values() if p.returncode is None]
        for proc in running:
            proc.signal(signal.SIGTERM)
        end = time.monotonic() + grace_s
        for proc in running:
            try:
                proc.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()

    def __enter__(self) -> LocalFederation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
