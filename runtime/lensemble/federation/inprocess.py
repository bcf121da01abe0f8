"""The in-process transport: deterministic, event-driven, with a virtual clock and faults.

When the coordinator opens a round, every participant that is not dropped trains immediately
(side by side on threads, whose learners `lensemble simulate` puts in worker processes:
:mod:`lensemble.simulation.workers`; the order of everything else is sorted id order) and its
submission is scheduled to arrive at a virtual time:
``1 + 0.01 * rank`` seconds after opening, or a fault's delay. :meth:`InProcessTransport.receive`
pops arrivals in time order and advances the virtual clock; a timeout costs no wall time. A
submission scheduled after the attempt closed (by its deadline, or by the straggler cutoff)
stays queued and reaches the coordinator in a later attempt, where the coordinator rejects it as
late (never counts it in that attempt). A ``delay`` without seconds makes a submission miss its
attempt whenever that closes: it arrives one virtual second after the close.

Participants behave as over the network: one update in flight at a time (a participant whose
late update is still on its way trains the next attempt only once that update was answered), and
an update the coordinator refuses is forgotten (:meth:`Participant.forget`), so the hash chain is
the network transport's for the same faults. Everything is a function of the config, seed and
fault plan.

A participant whose next attempt would spend past its own differential-privacy budget
(:class:`~lensemble.errors.PrivacyBudgetExhausted`) says so once in the log and is absent
(``privacy_budget``) from that attempt on.

A participant whose rank group exhausts its restarts (:class:`~lensemble.errors.RankGroupExhausted`)
leaves the run as its network process does (it says ``Leave`` and exits): it is absent (``left``)
from that attempt on, and the run goes on without it while the quorum allows.

Attack faults make a participant tamper with its own update, as over the network
(:meth:`Participant.take_faults`). An omniscient attacker (``*_omniscient``) trains after the
others of the attempt and is handed their honest updates (decoded from the payloads they
released), which only an in-process run can do.

Under ``federation.aggregation: masking`` a participant that trained keeps its update
(:class:`~lensemble.federation.masking_client.MaskingClient`, with an identity key and seed the
simulation derives from ``run.root_seed``) and answers the coordinator's secure-aggregation
sessions through :meth:`InProcessTransport.exchange`; nothing goes through the submission queue.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

import torch

from lensemble.errors import (
    OverlapBaseMissing,
    PrivacyBudgetExhausted,
    RankFailure,
    RankGroupExhausted,
)
from lensemble.federation.fault_kinds import OMNISCIENT_ATTACKS
from lensemble.federation.faults import FaultPlan, damage, poison_payload
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.masking import SessionKey, flatten
from lensemble.federation.masking_client import MaskingClient, SignedRounds
from lensemble.federation.messages import (
    LEFT,
    NO_BASE_MODEL,
    PRIVACY_BUDGET,
    RANK_FAILURE,
    RoundOpening,
    Submission,
    Verdict,
)
from lensemble.federation.participant import Contribution, Participant
from lensemble.federation.payload import decode
from lensemble.federation.quantization import dequantize
from lensemble.federation.secagg.identity import VerifyingKey, simulation_identity
from lensemble.federation.secagg.keys import simulation_seed
from lensemble.federation.transport import CoordinatorTransport, Traffic
from lensemble.machinery.cpus import cores_given

_log = logging.getLogger("lensemble.federation.inprocess")

#: Why a participant that was asked to train sends nothing (its absence reason follows).
TrainingRefused = RankFailure | RankGroupExhausted | PrivacyBudgetExhausted | OverlapBaseMissing


@dataclass(frozen=True)
class Delivery:
    """A submission as delivered, minus its payload bytes."""

    sender: str
    round_index: int
    payload_hash: str
    size: int
    attempt: int

    @classmethod
    def of(cls, submission: Submission) -> Delivery:
        """Summarise a submission."""
        return cls(
            submission.sender,
            submission.round_index,
            submission.payload_hash,
            len(submission.payload),
            submission.attempt,
        )


BASE_ARRIVAL_S = 1.0
ARRIVAL_STEP_S = 0.01
#: When a submission delayed without seconds arrives: this long after its attempt closed.
LATE_ARRIVAL_S = 1.0


class InProcessTransport(CoordinatorTransport):
    """Coordinator and participants in one process.

    Args:
        participants: Participant id -> participant.
        faults: Faults to inject.
        workers: Participants trained at once (threads); default: one per core this process
            is given, at most one per participant. 1 trains them one after another. The
            outcome is the same bit for bit either way.

    Attributes:
        delivered: Every submission handed to the coordinator, in delivery order, without its
            payload bytes (so long runs do not keep every payload alive).
        replies: Every (delivery, verdict) pair, in order.
        sent_by: Participant id -> number of payloads that participant released.
    """

    def __init__(
        self,
        participants: Mapping[str, Participant],
        faults: FaultPlan | None = None,
        *,
        workers: int | None = None,
    ) -> None:
        self.participants = dict(participants)
        if workers is None:
            workers = min(len(self.participants), cores_given())
        #: Trains participants side by side (:meth:`_contribute_all`); None: one after another.
        self._pool = (
            ThreadPoolExecutor(workers, thread_name_prefix="lensemble-participant")
            if workers > 1
            else None
        )
        self.faults = faults or FaultPlan()
        self.clock = 0.0
        self._queue: list[tuple[float, int, Submission]] = []
        # Submissions that miss the open attempt whenever it closes: (offset, seq, submission),
        # queued at the close plus LATE_ARRIVAL_S plus the offset (round_closed).
        self._late: list[tuple[float, int, Submission]] = []
        self._seq = itertools.count()
        self._down = self._up = 0
        self._compute = 0.0
        self.delivered: list[Delivery] = []
        self.replies: list[tuple[Delivery, Verdict]] = []
        self.sent_by: dict[str, int] = dict.fromkeys(self.participants, 0)
        self.finished = False
        self._opening: tuple[RoundOpening, bytes] | None = None
        #: Participant id -> its rank in the open attempt, for those waiting on an answer.
        self._waiting: dict[str, int] = {}
        #: Participant id -> why it sends nothing in the open attempt (a rank died).
        self._absence: dict[str, str] = {}
        #: Participant id -> the error it left the run with (its rank group exhausted its
        #: restarts): absent from every later attempt, as a network participant that exited.
        self.left: dict[str, RankGroupExhausted] = {}
        #: Participants that said their differential-privacy budget is spent (logged once).
        self.out_of_budget: set[str] = set()
        #: Participant id -> the payload it released in the open attempt (for omniscient
        #: attackers, which see the honest ones).
        self._released: dict[str, bytes] = {}
        self._keep_released = any(f.kind in OMNISCIENT_ATTACKS for f in self.faults.faults)
        for participant in self.participants.values():
            participant.take_faults(self.faults)
        self._masking = _masking_clients(self.participants)
        #: Under masking: the open attempt's self-reported statistics, and who sends its
        #: masked vector too late (a ``delay`` fault), misses the deadline.
        self._reports: dict[str, dict[str, str]] = {}
        self._late_masked: set[str] = set()

    def now(self) -> float:
        """Virtual time (seconds)."""
        return self.clock

    def wait_for_participants(self, quorum: int, timeout_s: float) -> set[str]:
        """Every in-process participant is present from the start."""
        return set(self.participants)

    def open_round(self, opening: RoundOpening, model_payload: bytes) -> None:
        """Let each participant train and schedule its submission's arrival.

        A participant whose earlier update is still in flight trains once it is answered
        (:meth:`reply`), as a network participant waits for its verdict before the next round.
        """
        t, a = opening.round_index, opening.attempt
        order = sorted(self.participants)
        if self.faults.active("reorder", t, a):
            order.reverse()
        self._opening = (opening, model_payload)
        self._waiting = {}
        self._absence = {}
        self._released = {}
        self._reports = {}
        self._late_masked = set()
        omniscient, ready = [], []
        for rank, pid in enumerate(order):
            if pid in self.left:
                self._absence[pid] = LEFT
            elif self._in_flight(pid):
                self._waiting[pid] = rank
            elif self._omniscient(pid, t, a):
                omniscient.append((rank, pid))  # trains once the honest updates exist
            else:
                ready.append((rank, pid))
        self._contribute_all(ready)
        for rank, pid in omniscient:
            self._contribute(pid, rank)

    def _omniscient(self, pid: str, round_index: int, attempt: int) -> bool:
        attacker = self.participants[pid].attacker
        return attacker is not None and attacker.needs_peers(round_index, attempt)

    def _peers(self, pid: str) -> dict[str, dict[str, torch.Tensor]] | None:
        """The honest updates released so far in the open attempt (for an omniscient ``pid``)."""
        assert self._opening is not None
        t, a = self._opening[0].round_index, self._opening[0].attempt
        if not self._omniscient(pid, t, a):
            return None
        hostile = self.faults.attackers()
        fed = self.participants[pid].config.federation
        arch = self.participants[pid].architecture
        peers = {}
        for other, payload in sorted(self._released.items()):
            if other in hostile:
                continue
            decoded = decode(payload)
            peers[other] = dequantize(decoded.tensors, arch, fed.quantization, fed.int8_chunk)
        return peers

    def _in_flight(self, pid: str) -> bool:
        queued = itertools.chain(self._queue, self._late)
        return any(submission.sender == pid for _, _, submission in queued)

    def _contribute(self, pid: str, rank: int) -> None:
        """Train ``pid`` on the open attempt now and schedule its update's arrival."""
        self._contribute_all([(rank, pid)])

    def _contribute_all(self, ready: list[tuple[int, str]]) -> None:
        """Train every ``(rank, participant)`` of ``ready``, then schedule the updates in order.

        With more than one worker the participants train on threads at once; everything that
        orders the run (faults, arrival times, counters) happens before or after, in the order
        of ``ready``, so the outcome is the serial one bit for bit (each participant trains on
        its own generators, single-threaded: :mod:`lensemble.machinery.determinism`).
        """
        assert self._opening is not None
        opening = self._opening[0]
        t, a = opening.round_index, opening.attempt
        jobs = []
        for rank, pid in ready:
            if self.faults.hits("drop", pid, t, a):
                continue
            kill = self.faults.hits("rank_kill", pid, t, a)
            if kill is not None:
                # Only a participant with a rank group has ranks to kill (checked by the caller).
                self.participants[pid].learner.arm_rank_kill(int(kill.value or 1))  # type: ignore[attr-defined]
            jobs.append((rank, pid))
        pids = [pid for _, pid in jobs]
        side_by_side = self._pool is not None and len(jobs) > 1
        start = time.perf_counter()
        outcomes = self._train_side_by_side(pids) if side_by_side else map(self._train, pids)
        for (rank, pid), outcome in zip(jobs, outcomes, strict=True):
            self._deliver(pid, rank, outcome, summed=not side_by_side)
        if side_by_side:
            # Side by side, the round waits for the slowest, not for the sum of them all.
            self._compute += time.perf_counter() - start

    def _train_side_by_side(self, pids: list[str]) -> list[Contribution | TrainingRefused]:
        """Each of ``pids``' outcomes, in order, trained at once on the pool's threads.

        A learner that must train on the main thread (``main_thread_only``) trains here while
        the others run. Every participant finishes before an error (a crash, a residency
        violation) goes up: none is left writing its state while the run stops or resumes.
        """
        assert self._pool is not None
        pool = self._pool
        futures = {
            pid: pool.submit(self._train, pid) for pid in pids if not self._main_thread_only(pid)
        }
        try:
            here = {pid: self._train(pid) for pid in pids if pid not in futures}
        finally:
            wait(futures.values())
        return [here[pid] if pid in here else futures[pid].result() for pid in pids]

    def _main_thread_only(self, pid: str) -> bool:
        """Whether ``pid``'s learner must train on this thread (a rank group's launcher)."""
        return bool(getattr(self.participants[pid].learner, "main_thread_only", False))

    def _train(self, pid: str) -> Contribution | TrainingRefused:
        """``pid``'s contribution to the open attempt, or why it sends none."""
        assert self._opening is not None
        opening, model_payload = self._opening
        try:
            return self.participants[pid].contribute(opening, model_payload, peers=self._peers(pid))
        except (RankFailure, RankGroupExhausted, PrivacyBudgetExhausted, OverlapBaseMissing) as exc:
            return exc

    def _deliver(
        self,
        pid: str,
        rank: int,
        outcome: Contribution | TrainingRefused,
        *,
        summed: bool = True,
    ) -> None:
        """Record ``pid``'s outcome: its update on the wire (or held), or its absence.

        ``summed``: add its compute seconds to the attempt's (participants trained one after
        another); side by side, the caller adds the wall time of them all instead.
        """
        if isinstance(outcome, RankFailure):
            self._absence[pid] = RANK_FAILURE
            return
        if isinstance(outcome, OverlapBaseMissing):
            self._absence[pid] = NO_BASE_MODEL
            return
        if isinstance(outcome, PrivacyBudgetExhausted):
            # The participant's own refusal: said once, then it sits out every attempt.
            if pid not in self.out_of_budget:
                _log.warning("%s", outcome)
                self.out_of_budget.add(pid)
            self._absence[pid] = PRIVACY_BUDGET
            return
        if isinstance(outcome, RankGroupExhausted):
            # Over the network this participant's process says Leave and exits non-zero; the
            # run goes on without it (quorum permitting), so it does here too.
            _log.error("participant '%s' leaves the run: %s", pid, outcome)
            self.left[pid] = outcome
            self._absence[pid] = LEFT
            return
        assert self._opening is not None
        self.sent_by[pid] += 1
        if self._keep_released:
            self._released[pid] = outcome.payload
        self._down += len(self._opening[1])
        if summed:
            self._compute += outcome.compute_s
        if self._masking:
            self._hold(pid, outcome.payload)
        else:
            self._send(pid, rank, outcome.payload, outcome.payload_hash)

    def _hold(self, pid: str, payload: bytes) -> None:
        """Under masking the update stays with its participant, which masks it when asked."""
        assert self._opening is not None
        t, a = self._opening[0].round_index, self._opening[0].attempt
        poison = self.faults.hits("poison", pid, t, a)
        if poison is not None and poison.value is not None:
            payload, _ = poison_payload(payload, poison.value)
        if self.faults.hits("delay", pid, t, a):
            self._late_masked.add(pid)
        decoded = decode(payload)
        participant = self.participants[pid]
        fed = participant.config.federation
        tensors = dequantize(decoded.tensors, participant.architecture, fed.quantization, 0)
        self._masking[pid].hold(t, a, flatten(tensors, participant.architecture))
        self._reports[pid] = dict(decoded.metadata)

    def masking_identities(self) -> dict[str, VerifyingKey]:
        """Every in-process participant's simulated identity public key."""
        return {pid: client.identity_key.public_key() for pid, client in self._masking.items()}

    def masking_present(self) -> set[str]:
        """Who holds an update for the open attempt: it trained (a ``drop`` did not)."""
        if self._opening is None:
            return set()
        t, a = self._opening[0].round_index, self._opening[0].attempt
        return {pid for pid, client in self._masking.items() if client.holds(t, a)}

    def exchange(
        self, stage: str, outgoing: Mapping[str, tuple[SessionKey, bytes]]
    ) -> Iterator[tuple[str, bytes]]:
        """Each addressed participant's answer, in rank order (reversed by ``reorder``).

        A participant whose masked vector is late (``delay``) answers nothing from the masked
        upload on; ``corrupt`` cuts its masked vector short (refused as ``bad_message``) and
        ``duplicate`` sends it twice.
        """
        if not outgoing:
            return
        some = next(iter(outgoing.values()))[0]
        t, a = some.round_index, some.attempt
        order = sorted(outgoing, reverse=bool(self.faults.active("reorder", t, a)))
        for pid in order:
            client = self._masking.get(pid)
            session, message = outgoing[pid]
            late = stage not in ("advertise", "share") and pid in self._late_masked
            answer = None if client is None or late else client.answer(session, stage, message)
            if answer is None:
                continue
            self._down += len(message)
            if stage == "mask" and self.faults.hits("corrupt", pid, t, a):
                # Bytes changed on the way are refused before they count (over the network by
                # the upload's SHA-256, here as a vector cut short): never summed in silence.
                answer = answer[:-1]
            copies = 2 if stage == "mask" and self.faults.hits("duplicate", pid, t, a) else 1
            for _ in range(copies):
                self._up += len(answer)
                yield pid, answer
            del answer  # summed by now: not held while the next participant masks

    def masked_reports(self) -> dict[str, dict[str, str]]:
        """The open attempt's participants' statistics (their payloads' metadata)."""
        return dict(self._reports)

    def _send(self, pid: str, rank: int, payload: bytes, payload_hash: str) -> None:
        """Put ``pid``'s update on the wire: the plan's faults, then its arrival time."""
        assert self._opening is not None
        t, a = self._opening[0].round_index, self._opening[0].attempt
        poison = self.faults.hits("poison", pid, t, a)
        if poison is not None and poison.value is not None:
            payload, payload_hash = poison_payload(payload, poison.value)
        if self.faults.hits("corrupt", pid, t, a):
            payload = damage(payload)
        arrival: float | None = self.clock + BASE_ARRIVAL_S + ARRIVAL_STEP_S * rank
        delay = self.faults.hits("delay", pid, t, a)
        if delay is not None:  # without seconds: after the attempt closed, whenever it does
            arrival = None if delay.seconds is None else self.clock + delay.seconds
        submission = Submission(pid, t, payload, payload_hash, a)
        copies = 2 if self.faults.hits("duplicate", pid, t, a) else 1
        for copy in range(copies):
            # A resend lands right behind the original, inside the same round.
            offset = copy * ARRIVAL_STEP_S / 10
            if arrival is None:
                self._late.append((offset, next(self._seq), submission))
            else:
                heapq.heappush(self._queue, (arrival + offset, next(self._seq), submission))

    def absence_reasons(self) -> dict[str, str]:
        """Why participants missing from the open attempt are missing (``rank_failure``)."""
        return dict(self._absence)

    def receive(self, until_s: float) -> Submission | None:
        """Next arrival at or before ``until_s``; otherwise jump the clock to ``until_s``."""
        if self._queue and self._queue[0][0] <= until_s:
            arrival, _, submission = heapq.heappop(self._queue)
            self.clock = max(self.clock, arrival)
            self.delivered.append(Delivery.of(submission))
            self._up += len(submission.payload)
            return submission
        self.clock = max(self.clock, until_s)
        return None

    def reply(self, submission: Submission, verdict: Verdict) -> None:
        """Record the verdict and act on it as a network participant does.

        A refused update is forgotten (the participant trains on as if absent from that
        attempt); a participant waiting for this answer then trains the open attempt.
        """
        self.replies.append((Delivery.of(submission), verdict))
        pid = submission.sender
        if pid not in self.participants:
            return
        if not verdict.accepted:
            self.participants[pid].forget(submission.round_index, submission.attempt)
        if pid in self._waiting and not self._in_flight(pid):
            self._contribute(pid, self._waiting.pop(pid))

    def round_closed(self, record: RoundRecord) -> None:
        """The attempt is over: participants still waiting sit it out.

        Submissions delayed past it are now on their way: they arrive :data:`LATE_ARRIVAL_S`
        after the close, in the next attempt.
        """
        self._opening = None
        self._waiting = {}
        self._released = {}
        for client in self._masking.values():
            client.forget()
        for offset, seq, submission in self._late:
            heapq.heappush(self._queue, (self.clock + LATE_ARRIVAL_S + offset, seq, submission))
        self._late = []

    def take_traffic(self) -> Traffic:
        """Bytes moved and compute seconds since the last call.

        Compute is summed over participants trained one after another, and the wall time of
        the training where they trained side by side.
        """
        traffic = Traffic(self._down, self._up, self._compute)
        self._down = self._up = 0
        self._compute = 0.0
        return traffic

    def finish(self) -> None:
        """Drop late submissions still queued; the run is over."""
        self._queue.clear()
        self._late.clear()
        self.finished = True
        if self._pool is not None:
            self._pool.shutdown()


def _masking_clients(participants: Mapping[str, Participant]) -> dict[str, MaskingClient]:
    """Under masking, each participant's secure-aggregation side (simulated identities)."""
    if not participants:
        return {}
    config = next(iter(participants.values())).config
    if config.federation.aggregation != "masking":
        return {}
    seed = config.run.root_seed
    keys = {pid: simulation_identity(seed, pid) for pid in participants}
    verifiers = {pid: key.public_key() for pid, key in keys.items()}
    return {
        pid: MaskingClient(
            p.config,
            pid,
            seed=simulation_seed(seed, pid),
            identity_key=keys[pid],
            verifiers=verifiers,
            architecture=p.architecture,
            signed=SignedRounds(p.masking_record),
        )
        for pid, p in participants.items()
    }
