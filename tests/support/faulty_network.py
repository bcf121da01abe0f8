"""The in-process fault plans (``lensemble.federation.faults``) played over the gRPC transport.

Each participant runs the production :class:`ParticipantLoop` against a live gRPC coordinator,
with the faults of a plan applied where a real network would cause them:

- ``drop``: the participant sits the attempt out (never trains or sends).
- ``delay`` past the deadline: the update is sent once the coordinator closed that attempt;
  ``delay=SECONDS`` within the deadline arrives in time, as in process.
- ``corrupt``: the bytes are damaged in transit (``faults.damage``); the declared hash is the
  original's.
- ``duplicate``: the same bytes are sent twice.
- ``reorder``: arrival order is the network's own; the committed hash never depends on it.
- under ``federation.aggregation: masking``, ``delay``: the participant answers nothing from the
  masked upload on (it advertised and shared its keys), as the in-process transport plays it.
- the attacks and ``misreport``: the participant makes them on itself
  (:meth:`Participant.take_faults`), as ``lensemble participant --faults`` does.

So both transports can be driven through the same schedule and their ledgers compared.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lensemble.config import LensembleConfig
from lensemble.federation.faults import FaultPlan, damage
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.messages import RoundOpening
from lensemble.federation.participant import Contribution, Participant
from lensemble.federation.payload import manifest
from lensemble.network.participant.client import CoordinatorClient
from lensemble.network.participant.loop import ParticipantLoop
from lensemble.network.shared.transport_errors import ShutdownRequested
from tests.support.federation import QuadraticLearner, initial_params

#: How often a delayed participant looks whether its attempt has closed (seconds).
POLL_S = 0.02


class FaultyLoop(ParticipantLoop):
    """A participant loop that applies a fault plan to its own rounds.

    Args:
        plan: The faults.
        attempt_closed: ``(round, attempt) -> bool``: the coordinator closed that attempt (or
            stopped).
    """

    def __init__(
        self,
        *args: Any,
        plan: FaultPlan,
        attempt_closed: Callable[[int, int], bool],
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.plan = plan
        self.attempt_closed = attempt_closed
        if self.masked is not None:
            pid = self.client.id
            self.masked.silent = lambda key, stage: (
                stage not in ("advertise", "share")
                and bool(self.plan.hits("delay", pid, key.round_index, key.attempt))
            )

    def _take_part(self, announcement: Any) -> None:
        key = (announcement.round_index, announcement.attempt)
        if self.plan.hits("drop", self.client.id, *key):
            self.after = key
            return
        super()._take_part(announcement)

    def _submit(self, opening: RoundOpening, contribution: Contribution) -> None:
        pid, key = self.client.id, (opening.round_index, opening.attempt)
        if self.plan.hits("corrupt", pid, *key):
            contribution = dataclasses.replace(contribution, payload=damage(contribution.payload))
        delay = self.plan.hits("delay", pid, *key)
        timeout = self.config.federation.round_timeout_s
        if delay is not None and (delay.seconds is None or delay.seconds > timeout):
            while not self.attempt_closed(*key):
                self._check_stop()
                self.stop.wait(POLL_S)
        super()._submit(opening, contribution)
        if self.plan.hits("duplicate", pid, *key):
            super()._submit(opening, contribution)


class FaultyParticipantThread:
    """A quadratic-learner participant running :class:`FaultyLoop` in a thread."""

    def __init__(
        self,
        config: LensembleConfig,
        pid: str,
        output_dir: Path,
        plan: FaultPlan,
        attempt_closed: Callable[[int, int], bool],
    ) -> None:
        theta0 = initial_params(config.run.root_seed)
        participant = Participant(
            config, pid, QuadraticLearner(pid, config.run.root_seed), manifest(theta0), output_dir
        )
        participant.take_faults(plan.of_participant(pid))
        self.client = CoordinatorClient(config, pid)
        self.loop = FaultyLoop(
            config, participant, self.client, plan=plan, attempt_closed=attempt_closed
        )
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"participant-{pid}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.loop.run()
        except BaseException as exc:
            self.error = exc

    def close(self) -> None:
        """Stop the loop and close the channel."""
        self.loop.stop.set()
        self.thread.join(10)
        self.client.close()


@dataclasses.dataclass
class LiveRun:
    """A fault plan's run over gRPC: the coordinator's records, its error, every participant."""

    records: list[RoundRecord]
    error: BaseException | None
    threads: list[FaultyParticipantThread]

    def participant_errors(self) -> list[BaseException]:
        """Errors the participants ended with, a requested shutdown aside."""
        return [t.error for t in self.threads if not isinstance(t.error, ShutdownRequested | None)]


def run_over_grpc(
    config: LensembleConfig, plan: FaultPlan, out: Path, timeout_s: float = 180.0
) -> LiveRun:
    """Run ``config`` with a live gRPC coordinator and one :class:`FaultyParticipantThread` each.

    Raises:
        AssertionError: The coordinator did not finish within ``timeout_s`` (seconds).
    """
    from tests.support.network import LiveCoordinator

    with LiveCoordinator(config, output_dir=out) as live:

        def attempt_closed(round_index: int, attempt: int) -> bool:
            done = {(r.round, r.attempt) for r in list(live.coordinator.records)}
            return (round_index, attempt) in done or not live.thread.is_alive()

        threads = [
            FaultyParticipantThread(config, pid, out, plan, attempt_closed)
            for pid in config.participant_ids
        ]
        live.thread.join(timeout_s)
        assert not live.thread.is_alive(), "the coordinator did not finish"
        for t in threads:
            if live.error is None:
                t.thread.join(30)
            t.close()
        return LiveRun(list(live.coordinator.records), live.error, threads)
