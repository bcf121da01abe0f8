"""The commit: the outer step behind its pre-commit check, and the commit written behind.

:func:`outer_step` checks the new model tensor by tensor (finite, bounded change;
:func:`lensemble.federation.robustness.precommit_problem`) and only when it passes takes the
DiLoCo outer Nesterov step in place, hashing each checked tensor on the hashing thread meanwhile
so the new model's hash is ready with the step.

:class:`Committer` ends attempts and makes a committed one durable (checkpoint, then ledger
line), telling the transport and the observer. Under
:meth:`lensemble.federation.coordinator.Coordinator.run` it does so behind, on a commit thread:
the next round opens while they are written, and that round cannot aggregate, abort or end the
run before they are (:meth:`Committer.settle`; docs/performance.md#write-behind-commits).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import torch

from lensemble.config.schema import LensembleConfig, RobustnessConfig
from lensemble.federation.checkpoint import CoordinatorCheckpoint
from lensemble.federation.coordinator_store import CoordinatorStore
from lensemble.federation.diloco import OuterStep
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.payload import model_hash_behind
from lensemble.federation.robustness import precommit_problem
from lensemble.federation.rounds import RoundMachine, RoundState
from lensemble.federation.transport import CoordinatorTransport

Params = dict[str, torch.Tensor]

_log = logging.getLogger("lensemble.federation.coordinator")


def scheduled(
    outer: OuterStep, config: LensembleConfig, version: int, defences: dict[str, object]
) -> OuterStep:
    """``outer`` as ``federation.outer_optimizer``'s schedule sets it for ``version``.

    A scheduled step's coefficients go into ``defences["outer"]`` (the signed ledger); without
    a schedule ``outer`` is returned as it is and nothing is recorded.
    """
    opt = config.federation.outer_optimizer
    if opt.lr_half_life_rounds is None and opt.momentum_half_life_rounds is None:
        return outer
    step = outer.at(
        version, opt.lr_half_life_rounds, opt.momentum_half_life_rounds, opt.lr_hold_rounds
    )
    defences["outer"] = {"lr": step.lr, "momentum": step.momentum}
    return step


def outer_step(
    outer: OuterStep,
    params: Params,
    momentum: Params,
    combined: Params,
    robustness: RobustnessConfig,
    *,
    version: int,
    parent: str,
    defences: dict[str, object],
) -> str | None:
    """Check the model the outer step would give; take the step in place only if it passes.

    The check reads the new model tensor by tensor; no second copy of the model and its
    momentum is ever held. Each checked tensor is hashed meanwhile; its tensors are the step's
    bit for bit (:meth:`OuterStep.candidate`).

    Args:
        outer: The outer optimizer.
        params: The global model at ``version`` (changed in place when the check passes).
        momentum: Its outer momentum (changed in place likewise).
        combined: The aggregated pseudo-gradient.
        robustness: ``federation.robustness`` (``max_relative_change``).
        version: The model version stepped from.
        parent: Its hash (the new hash chains to it).
        defences: Gets ``relative_change``, and ``precommit`` when the check fails.

    Returns:
        The new model's hash, or None when the check failed (nothing changed).
    """
    with model_hash_behind(version + 1, parent) as hasher:
        candidate = outer.candidate(params, combined, momentum)
        change, problem = precommit_problem(
            params, candidate, robustness.max_relative_change, on_checked=hasher.add
        )
        defences["relative_change"] = float(f"{change:.6g}") if change is not None else None
        if problem is not None:
            defences["precommit"] = problem
            return None
        outer.apply_in_place(params, combined, momentum)
        return hasher.result(sorted(params))


@dataclass
class _PendingCommit:
    """A committed attempt whose checkpoint and ledger line are still being written."""

    machine: RoundMachine
    # Resolves to the seconds the checkpoint and the ledger append took; raises their error.
    written: Future[float]
    # Set once the durable line has been announced (or its failure logged).
    announced: threading.Event = field(default_factory=threading.Event)


class DurableObserver(Protocol):
    """Hears of each attempt whose ledger line is durable (the coordinator's observer)."""

    def on_round(self, record: RoundRecord) -> None:
        """A round attempt ended (committed or aborted) and its line is durable."""
        ...


class Committer:
    """Ends attempts: appends their ledger lines, at once or behind on a commit thread.

    Args:
        store: Where checkpoints and ledger lines go.
        observer: Hears of each durable line.

    Attributes:
        records: Every attempt ended by this process, in order; under write-behind the last
            commit may still be being written until :meth:`settle`.
        commit_s: Seconds the last commit's checkpoint and ledger line took, or None before
            the first (the next ledger line reports it).
    """

    def __init__(self, store: CoordinatorStore, observer: DurableObserver | None = None) -> None:
        self.store = store
        self.observer = observer
        self.records: list[RoundRecord] = []
        self.commit_s: float | None = None
        self._pending: _PendingCommit | None = None
        self._executor: ThreadPoolExecutor | None = None

    def close(
        self, record: RoundRecord, transport: CoordinatorTransport, *, checkpoint: str | None
    ) -> None:
        """Append the attempt's line now, then tell the transport and the observer.

        Args:
            record: The attempt's record.
            transport: Told the attempt is over and its line durable.
            checkpoint: State hash of the checkpoint it committed (None for an abort).
        """
        self.store.append(record, checkpoint)
        self._closed(record, transport)
        self._durable(record, transport)

    def _closed(self, record: RoundRecord, transport: CoordinatorTransport) -> None:
        self.records.append(record)
        transport.round_closed(record)

    def _durable(self, record: RoundRecord, transport: CoordinatorTransport) -> None:
        """Tell the transport and the observer that ``record``'s line is durable.

        Under write-behind this runs on the commit thread (observers must be thread-safe;
        the network coordinator's log and metrics are).
        """
        transport.round_durable(record)
        if self.observer is not None:
            self.observer.on_round(record)

    def write_behind(
        self,
        record: RoundRecord,
        ckpt: CoordinatorCheckpoint | None,
        machine: RoundMachine,
        transport: CoordinatorTransport,
    ) -> None:
        """Hand a committed attempt's checkpoint and ledger line to the commit thread.

        The transport stops collecting at once (as after a synchronous commit), so the next
        round can open, and the record joins ``records``. The transport's ``round_durable``
        and the observer's ``on_round`` hear of it from the commit thread once its line is
        durable; :meth:`settle` waits for that.

        Args:
            record: The committed attempt's record.
            ckpt: Its checkpoint (None without an output folder).
            machine: Its state machine (advanced to CLOSED once settled).
            transport: Told the attempt is over, and later that its line is durable.
        """
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="lensemble-commit")
        written = self._executor.submit(self.store.write_commit, record, ckpt)
        pending = _PendingCommit(machine, written)
        self._pending = pending
        self._closed(record, transport)

        def done(future: Future[float]) -> None:  # on the commit thread, once it is done
            try:
                if future.exception() is None:
                    self._durable(record, transport)
                else:
                    _log.error(
                        "the checkpoint or ledger line of round %d failed (%s); the run stops "
                        "once the round now collecting ends, and a resume redoes round %d.",
                        record.round,
                        future.exception(),
                        record.round,
                    )
            finally:
                pending.announced.set()

        written.add_done_callback(done)

    def failed(self) -> bool:
        """True once a commit written behind has failed (collection may stop early)."""
        pending = self._pending
        return (
            pending is not None
            and pending.written.done()
            and (pending.written.exception() is not None)
        )

    def settle(self) -> RoundMachine | None:
        """Wait until the commit written behind is durable; re-raise its error.

        Returns:
            The settled attempt's machine (now CLOSED), or None when nothing was pending.

        Raises:
            DiskFull, OSError, IntegrityError: Whatever the checkpoint or the ledger append
                raised; the round is then not committed and a resume redoes it.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        self.commit_s = pending.written.result()
        pending.announced.wait()  # the durable line's announcement, made on the commit thread
        pending.machine.advance(RoundState.CLOSED)
        return pending.machine

    def shutdown(self) -> None:
        """Stop the commit thread (after the last commit settled)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
