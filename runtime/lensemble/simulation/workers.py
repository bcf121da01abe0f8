"""The simulation's worker processes: participants' learners and the baselines on every core.

Python threads take turns on the interpreter lock, and the default world model's inner steps
are mostly Python driving small kernels, so participants and baselines trained on threads barely
overlap (docs/performance.md#the-simulation-on-every-core). :class:`SimulationWorkers` starts
``W`` worker processes and deals them work that keeps its state between rounds:

- **learners**: each single-process participant's learner is built in one worker (sorted ids,
  dealt round-robin), from the run's config and the participant's data cache, as
  ``lensemble participant`` builds its own. The simulation's participant holds a
  :class:`RemoteLearner`, the :class:`~lensemble.learner.Learner` seam forwarded over a pipe.
  Everything else a participant does (verifying the model, its attacks, the residency guard,
  sealing, snapshots) stays in the simulation's process, so the transport, the faults and the
  ledger do not change;
- **baselines**: each baseline of :class:`~lensemble.simulation.evaluation.Evaluation` (each
  site alone, the pooled oracle, FedAvg) lives in one worker, which trains it and returns its
  held-out scores (:meth:`SimulationWorkers.baseline`).

The bits do not change either: each learner and baseline trains single-threaded on its own
generators, wherever it runs (``tests/simulation/test_workers.py``). The pipe carries a small
JSON header and tensors as safetensors bytes, never a pickle; the workers start from the fork
server (:mod:`lensemble.ranks.launch`), a clean interpreter that imported torch once. A worker
ignores SIGINT (the simulation's process answers it) and exits when its pipe closes, so it
never outlives the simulation.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import struct
import threading
import weakref
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, NoReturn

from lensemble import errors
from lensemble.errors import LensembleError
from lensemble.learner import LocalRound, Params

if TYPE_CHECKING:
    import torch

    from lensemble.config import LensembleConfig

_HEADER = struct.Struct("<I")


class TrainingProcessFailed(LensembleError):
    """A worker process of the simulation (it holds learners and baselines) died or failed."""

    code = "training_process_failed"
    exit_code = errors.EXIT_RUN_FAILED


def _frame(header: Mapping[str, Any], tensors: Mapping[str, torch.Tensor] | None = None) -> bytes:
    """One message: a 4-byte little-endian header length, the JSON header, safetensors bytes."""
    from safetensors.torch import save

    head = json.dumps(header).encode()
    body = save({k: v.contiguous() for k, v in tensors.items()}) if tensors else b""
    return _HEADER.pack(len(head)) + head + body


def _unframe(data: bytes) -> tuple[dict[str, Any], Params]:
    """The header and tensors of a :func:`_frame` (tensors in fresh memory)."""
    from safetensors.torch import load

    (size,) = _HEADER.unpack_from(data)
    header = json.loads(data[_HEADER.size : _HEADER.size + size])
    body = data[_HEADER.size + size :]
    return header, (load(body) if body else {})


def _error_reply(exc: BaseException) -> dict[str, Any]:
    """What crosses the pipe of an exception: its class name, message and plain attributes."""
    if isinstance(exc, LensembleError):
        attrs = {
            k: v
            for k, v in vars(exc).items()
            if k not in ("message", "remediation") and isinstance(v, (str, int, float, bool))
        }
        return {
            "type": type(exc).__name__,
            "message": exc.message,
            "remediation": exc.remediation,
            "attrs": attrs,
        }
    return {"type": "", "message": f"{type(exc).__name__}: {exc}", "remediation": "", "attrs": {}}


def _raise_reply(error: Mapping[str, Any], what: str) -> NoReturn:
    """Raise the worker's exception again, as its own class when it is one of Lensemble's.

    An exception that crosses a process boundary keeps its type only if it is classified by
    cause: a :class:`~lensemble.errors.LensembleError` comes back as itself (so the transport
    still tells a spent privacy budget from a crash); anything else is our bug, said as such.
    """
    cls = getattr(errors, str(error.get("type", "")), None)
    if isinstance(cls, type) and issubclass(cls, LensembleError):
        exc = cls.__new__(cls)
        LensembleError.__init__(exc, error["message"], remediation=error["remediation"])
        for key, value in error.get("attrs", {}).items():
            setattr(exc, key, value)
        raise exc
    raise TrainingProcessFailed(
        f"{what} failed in its worker process: {error.get('message')};",
        remediation="this is a Lensemble bug: please report it with the command; --workers 1 "
        "trains in the simulation's own process.",
    )


def _serve(
    conn: Connection,
    config_json: str,
    participant_ids: Sequence[str],
    cwd: str,
    env: dict[str, str],
) -> None:
    """A worker process: build the learners of ``participant_ids``, then answer until EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The fork server kept the environment and folder of its own start: take the simulation's.
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    import torch

    from lensemble.config import LensembleConfig
    from lensemble.ranks.learner import learner_for

    torch.set_num_threads(1)  # one job at a time, single-threaded as on a thread
    try:
        config = LensembleConfig.model_validate_json(config_json)
        baselines = _Baselines(config)
        learners = {pid: learner_for(config, pid, baselines.data(pid)) for pid in participant_ids}
    except BaseException as exc:  # reported to the simulation, then exit
        conn.send_bytes(_frame({"error": _error_reply(exc)}))
        return
    conn.send_bytes(_frame({"ready": True}))
    while True:
        try:
            header, tensors = _unframe(conn.recv_bytes())
        except (EOFError, OSError):
            return  # the simulation closed the pipe, or is gone
        if header.get("op") == "stop":
            return
        try:
            if header.get("op") == "baseline":
                reply = _frame({"report": baselines.report(header["name"], header["rounds"])})
            else:
                reply = _answer(learners[header["participant"]], header, tensors)
        except BaseException as exc:  # every failure goes back, classified
            reply = _frame({"error": _error_reply(exc)})
        conn.send_bytes(reply)


class _Baselines:
    """The baselines a worker holds, built on first use and trained on from round to round.

    It also holds the participants' data the worker has read, each read once: its learners'
    (at start) and, once it scores a baseline, everyone's.
    """

    def __init__(self, config: LensembleConfig) -> None:
        self.config = config
        self.datasets: dict[str, Any] = {}
        self.runs: dict[str, Any] = {}

    def data(self, participant_id: str) -> Any:
        """The participant's data, read from its cache (or collected) on first use."""
        if participant_id not in self.datasets:
            from lensemble.data.trajectories import load_or_collect

            self.datasets[participant_id] = load_or_collect(self.config, participant_id)
        return self.datasets[participant_id]

    def report(self, name: str, rounds: int) -> dict[str, Any]:
        """``EvalReport.to_dict()`` of baseline ``name`` after ``rounds`` (trained first)."""
        from lensemble.eval.heldout import evaluate

        datasets = {pid: self.data(pid) for pid in self.config.participant_ids}
        if name not in self.runs:
            from lensemble.simulation.baselines import baseline_run

            self.runs[name] = baseline_run(self.config, datasets, name)
        params = self.runs[name].train_until(int(rounds))
        report: dict[str, Any] = evaluate(self.config, params, datasets).to_dict()
        return report


def _answer(learner: Any, header: Mapping[str, Any], tensors: Params) -> bytes:
    """Run one request on ``learner``; the reply frame."""
    op = header["op"]
    if op == "train":
        local = learner.train_round(tensors, int(header["round"]), int(header["steps"]))
        info = {
            "mean_loss": repr(float(local.mean_loss)),  # repr: NaN and every bit survive
            "compute_seconds": local.compute_seconds,
            "privacy_epsilon": local.privacy_epsilon,
        }
        return _frame(info, local.params)
    if op == "heldout":
        loss = learner.heldout_loss(tensors)
        return _frame({"loss": None if loss is None else repr(float(loss))})
    if op == "inner_state":
        return _frame({}, learner.inner_state())
    if op == "load_inner_state":
        learner.load_inner_state(tensors)
        return _frame({})
    raise ValueError(f"unknown request {op!r}")


class _Worker:
    """One worker process and its pipe; one request at a time."""

    def __init__(self, process: Any, conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self.lock = threading.Lock()

    def ask(
        self,
        what: str,
        header: Mapping[str, Any],
        tensors: Mapping[str, torch.Tensor] | None = None,
    ) -> tuple[dict[str, Any], Params]:
        """Send one request and wait for its reply: ``(header, tensors)``.

        ``what`` names the request's subject in errors ("participant 'alpine'").

        Raises:
            TrainingProcessFailed: The worker died (its exit code is named).
        """
        with self.lock:
            try:
                self.conn.send_bytes(_frame(header, tensors))
            except OSError:
                self._died(what)
            return self.receive(what)

    def receive(self, what: str) -> tuple[dict[str, Any], Params]:
        """The next frame the worker sends (its reply, or the first: ready or an error).

        Raises:
            TrainingProcessFailed: The worker died (its exit code is named).
        """
        try:
            return _unframe(self.conn.recv_bytes())
        except (EOFError, OSError):
            self._died(what)

    def _died(self, what: str) -> NoReturn:
        self.process.join(timeout=5)
        code = self.process.exitcode
        how = ", killed by a signal" if code is not None and code < 0 else ""
        raise TrainingProcessFailed(
            f"the worker process of {what} exited (exit code {code}{how});",
            remediation="if the machine ran out of memory, rerun with fewer --workers "
            "(--workers 1 trains in the simulation's own process).",
        ) from None

    def close(self) -> None:
        """Ask the worker to stop and wait for it (seconds: at most 10, then it is killed)."""
        with self.lock:
            with contextlib.suppress(OSError):  # already gone
                self.conn.send_bytes(_frame({"op": "stop"}))
            self.conn.close()
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


class RemoteLearner:
    """A participant's :class:`~lensemble.learner.Learner`, held by a worker process.

    Every method forwards to the learner that :func:`lensemble.ranks.learner.build_learner`
    built in the worker, with the same arguments, returns and errors (a
    :class:`~lensemble.errors.LensembleError` keeps its class); tensors cross as safetensors
    bytes, so they come back bit for bit, in fresh memory.

    Raises (every method):
        TrainingProcessFailed: The worker process died, or failed with an error that is not
            one of Lensemble's.
    """

    def __init__(self, participant_id: str, worker: _Worker) -> None:
        self.participant_id = participant_id
        self._worker = worker

    def _ask(
        self, header: dict[str, Any], tensors: Mapping[str, torch.Tensor] | None = None
    ) -> tuple[dict[str, Any], Params]:
        what = f"participant '{self.participant_id}'"
        reply, out = self._worker.ask(what, {**header, "participant": self.participant_id}, tensors)
        if "error" in reply:
            _raise_reply(reply["error"], what)
        return reply, out

    def train_round(
        self, global_params: Mapping[str, torch.Tensor], round_index: int, steps: int
    ) -> LocalRound:
        """See :meth:`lensemble.learner.Learner.train_round`."""
        info, params = self._ask(
            {"op": "train", "round": round_index, "steps": steps}, global_params
        )
        return LocalRound(
            params=params,
            mean_loss=float(info["mean_loss"]),
            compute_seconds=float(info["compute_seconds"]),
            privacy_epsilon=info["privacy_epsilon"],
        )

    def heldout_loss(self, global_params: Mapping[str, torch.Tensor]) -> float | None:
        """See :meth:`lensemble.learner.Learner.heldout_loss`."""
        info, _ = self._ask({"op": "heldout"}, global_params)
        return None if info["loss"] is None else float(info["loss"])

    def inner_state(self) -> Params:
        """See :meth:`lensemble.learner.Learner.inner_state` (copies, in this process)."""
        return self._ask({"op": "inner_state"})[1]

    def load_inner_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """See :meth:`lensemble.learner.Learner.load_inner_state`."""
        self._ask({"op": "load_inner_state"}, state)


class SimulationWorkers:
    """Worker processes holding a simulation's learners and baselines.

    Args:
        config: The run's config; every participant's data is already in its cache (the
            workers read it, or collect it as ``lensemble participant`` would).
        participant_ids: Whose learners the workers build (their sorted ids are dealt
            round-robin over the workers); the others keep theirs in the simulation's process.
        workers: Processes to start (at least 1).

    Raises:
        ConfigError: A worker could not build a learner (as building it here would).
        TrainingProcessFailed: A worker died while it started.
    """

    def __init__(
        self, config: LensembleConfig, participant_ids: Sequence[str], workers: int
    ) -> None:
        from lensemble.ranks.launch import start_fork_server

        start_fork_server()
        context = multiprocessing.get_context("forkserver")
        ids = sorted(participant_ids)
        count = max(1, workers)
        shares = [ids[k::count] for k in range(count)]
        config_json = config.model_dump_json()
        self._workers: list[_Worker] = []
        #: Participant id -> its learner in a worker.
        self.learners: dict[str, RemoteLearner] = {}
        #: Baseline name -> the index of the worker that holds it (deal_baselines).
        self._baseline_workers: dict[str, int] = {}
        self._closer = weakref.finalize(self, _close_all, self._workers)
        try:
            for share in shares:
                ours, theirs = context.Pipe()
                process = context.Process(
                    target=_serve,
                    args=(theirs, config_json, share, os.getcwd(), dict(os.environ)),
                    name=f"lensemble-worker-{len(self._workers)}",
                    daemon=True,
                )
                process.start()
                theirs.close()
                worker = _Worker(process, ours)
                self._workers.append(worker)
                self.learners.update({pid: RemoteLearner(pid, worker) for pid in share})
            for worker in self._workers:
                what = f"worker {worker.process.name}"
                reply, _ = worker.receive(what)
                if "error" in reply:
                    _raise_reply(reply["error"], what)
        except BaseException:
            self.close()
            raise

    @property
    def processes(self) -> list[Any]:
        """The worker processes (``multiprocessing`` process objects), in start order."""
        return [worker.process for worker in self._workers]

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids, in start order."""
        return [int(worker.process.pid) for worker in self._workers]

    def deal_baselines(self, names: Sequence[str]) -> None:
        """Give each baseline of ``names`` a worker, round-robin in that order.

        ``names``: ``local_only:<participant id>``, ``pooled``, ``fedavg``
        (:func:`lensemble.simulation.baselines.baseline_run`). A name dealt before keeps its
        worker.
        """
        for name in names:
            self._baseline_workers.setdefault(
                name, len(self._baseline_workers) % len(self._workers)
            )

    def baseline(self, name: str, rounds: int) -> dict[str, Any]:
        """Baseline ``name``'s held-out scores after ``rounds`` rounds, trained in its worker.

        ``name`` is one of :meth:`deal_baselines`'s; it always goes to the same worker, which
        keeps it between calls (so a call trains only the rounds not trained yet). Safe to call
        from several threads: a worker answers one request at a time.

        Returns:
            ``EvalReport.to_dict()``, as :class:`~lensemble.simulation.evaluation.Evaluation`
            computes it in this process.

        Raises:
            KeyError: ``name`` was not dealt.
            TrainingProcessFailed: The worker died or failed.
        """
        what = f"baseline '{name}'"
        worker = self._workers[self._baseline_workers[name]]
        reply, _ = worker.ask(what, {"op": "baseline", "name": name, "rounds": rounds})
        if "error" in reply:
            _raise_reply(reply["error"], what)
        report: dict[str, Any] = reply["report"]
        return report

    def close(self) -> None:
        """Stop every worker (idempotent)."""
        self._closer()


def _close_all(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.close()
