"""The coordinator's side of masked rounds over gRPC: each stage's messages out, answers in.

Under ``federation.aggregation: masking`` the coordinator's thread drives one secure-aggregation
session per group (:mod:`lensemble.federation.masked_round`), all groups in lock-step, through
:meth:`MaskingExchange.exchange`: it posts the stage's message of each addressed participant's
session, then yields the answers as the handler threads land them, until every addressed
participant still present has answered or the stage's deadline passed. One deadline covers the
stage of every group. Who does not answer in time is simply absent from the answers: its
session counts it as dropped.

Handler threads meet the coordinator's thread here, under the attempt board's lock (so a broken
presence stream wakes a waiting stage at once):

- :meth:`next_message` hands a participant its message of the stage being collected
  (``MaskingStages``), once;
- :meth:`precheck` and :meth:`land` judge and keep an answer (``AnswerStage``): an answer for
  a session not being collected (``unknown_session``), a stage name outside ``STAGES``
  (``unknown_stage``), a stage that is not the one being collected (``closed_stage``), a
  participant the stage did not address in that session (``not_addressed``) or a second answer
  (``duplicate_answer``) is refused and never reaches a session.

Identities: each participant's certificate, as the mTLS handshake of its ``Join`` authenticated
it, is kept (:meth:`remember`); its public key is the participant's identity key
(:meth:`identities`), and the certificates are relayed to the roster with the ``advertise``
stage so that each participant checks its peers' keys against its own CA.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from cryptography import x509

from lensemble.federation.masking import SessionKey
from lensemble.federation.secagg import identity
from lensemble.federation.secagg.driver import STAGES
from lensemble.network.coordinator.attempt_board import AttemptBoard
from lensemble.network.coordinator.liveness import Liveness
from lensemble.network.coordinator.rejection import Rejection
from lensemble.network.shared import transport_errors as nerr
from lensemble.network.shared.masking_limits import MAX_CERTIFICATE_BYTES

_log = logging.getLogger("lensemble.network.coordinator")

#: How often a waiting stage looks again at who is still present (seconds), besides the wake-ups
#: of answers and presence changes.
RECHECK_S = 0.5


@dataclass(frozen=True)
class StageMessage:
    """One participant's message of one stage.

    Attributes:
        session: The session (round, attempt, group).
        stage: One of ``STAGES``.
        payload: The stage's message bytes (empty for ``advertise``).
        peers: With ``advertise``: roster member -> its certificate (PEM); else empty.
        deadline_s: When the stage stops collecting answers (monotonic seconds).
    """

    session: SessionKey
    stage: str
    payload: bytes
    peers: Mapping[str, bytes]
    deadline_s: float


@dataclass
class _Stage:
    """The stage being collected in every session of the attempt.

    Whom it addresses (each in its session), who got its message, who answered.
    """

    round_index: int
    attempt: int
    stage: str
    sessions: dict[str, SessionKey]
    outgoing: dict[str, bytes]
    #: With ``advertise``: per session, its addressed members' certificates (PEM).
    peers: dict[SessionKey, dict[str, bytes]]
    deadline_s: float
    delivered: set[str] = field(default_factory=set)
    answered: set[str] = field(default_factory=set)
    arrived: deque[tuple[str, bytes | memoryview]] = field(default_factory=deque)


class MaskingExchange:
    """Stage messages and answers of masked rounds, shared by the coordinator's and handler threads.

    Args:
        board: The round state and its lock (the open attempt, the stop flag).
        liveness: Who is present (a stage never waits for an absent participant).
        stage_timeout_s: Longest wait for the answers of one stage (seconds); the ``advertise``
            stage also waits until the attempt's deadline (participants train first).
        mask_timeout_s: Longest wait for the masked vectors (seconds; they are the large ones).

    Attributes:
        mask_timeout_s: As the argument; the server raises it once it knows d (one
            ``rpc_timeout_s`` per chunk of the masked vector, plus two).
    """

    def __init__(
        self,
        board: AttemptBoard,
        liveness: Liveness,
        *,
        stage_timeout_s: float,
        mask_timeout_s: float,
    ) -> None:
        self._board = board
        self._liveness = liveness
        self._stage_timeout_s = stage_timeout_s
        self.mask_timeout_s = mask_timeout_s
        self._certificates: dict[str, bytes] = {}
        self._stage: _Stage | None = None
        self._reports: dict[str, dict[str, str]] = {}
        #: Who has watched the open attempt's stages: it trained (:meth:`present`).
        self._ready: set[str] = set()
        #: Bytes of stage messages sent and of answers received since the last take.
        self.bytes_down = 0
        self.bytes_up = 0

    # -------------------------------------------------------------------- identities
    def remember(self, participant: str, certificate_pem: bytes) -> None:
        """Keep the certificate ``participant``'s authenticated handshake presented.

        A certificate too long or whose key cannot sign secure-aggregation messages is not kept
        (the participant's sessions then abort with a named reason, never silently).
        """
        if len(certificate_pem) > MAX_CERTIFICATE_BYTES:
            _log.warning("the certificate of %s is too long to relay; not kept.", participant)
            return
        try:
            identity.check_key_type(_public_key(certificate_pem))  # type: ignore[arg-type]
        except (ValueError, TypeError) as exc:
            _log.warning("the certificate of %s cannot sign for masking: %s", participant, exc)
            return
        with self._board.cond:
            self._certificates[participant] = certificate_pem

    def identities(self) -> dict[str, identity.VerifyingKey]:
        """Every participant's identity public key, from the certificate it joined with."""
        with self._board.cond:
            certificates = dict(self._certificates)
        return {pid: _public_key(pem) for pid, pem in certificates.items()}  # type: ignore[misc]

    # ------------------------------------------------------------ the coordinator's thread
    def exchange(
        self, stage: str, outgoing: Mapping[str, tuple[SessionKey, bytes]]
    ) -> Iterator[tuple[str, bytes | memoryview]]:
        """Post ``stage``'s message to each participant in its session; yield answers as they land.

        ``outgoing`` maps each addressed participant to its session and message; all sessions
        are of the open attempt, and every one's stage shares one deadline.

        Ends when every addressed participant still present has answered, or at the stage's
        deadline; the stage is then closed (later answers are refused ``closed_stage``). Answers
        are handed out one at a time and not kept once handed out: a masked vector is a view of
        its spool file, which goes back (and leaves the coordinator's resident memory) as soon
        as its consumer has added it to the sum and dropped it.

        Raises:
            ShutdownRequested: The coordinator is stopping.
        """
        board = self._board
        with board.cond:
            board.check_stop()
            self._stage = self._posted(stage, outgoing)
            board.cond.notify_all()
        try:
            while True:
                with board.cond:
                    current = self._stage
                    assert current is not None
                    while not current.arrived and not self._over(current):
                        board.check_stop()
                        board.cond.wait(min(RECHECK_S, current.deadline_s - board.now()))
                    if not current.arrived:
                        return  # over, and nothing left to hand out
                    answer = current.arrived.popleft()
                yield answer
                del answer  # never held while waiting for the next one
        finally:
            with board.cond:
                self._stage = None

    def _posted(self, stage: str, outgoing: Mapping[str, tuple[SessionKey, bytes]]) -> _Stage:
        """The stage to collect (caller holds the lock)."""
        now = self._board.now()
        timeout = self.mask_timeout_s if stage == "mask" else self._stage_timeout_s
        deadline = now + timeout
        opening = self._board.opening
        sessions = {p: session for p, (session, _) in outgoing.items()}
        peers: dict[SessionKey, dict[str, bytes]] = {}
        if stage == "advertise":
            # Participants train before they advertise: wait for the attempt's deadline.
            if opening is not None:
                deadline = max(deadline, opening.deadline_s)
            for p, session in sessions.items():
                if p in self._certificates:
                    peers.setdefault(session, {})[p] = self._certificates[p]
        # An attempt with no session to run addresses no one: any round index names it.
        some = next(iter(sessions.values()), SessionKey(-1, -1, -1))
        return _Stage(
            some.round_index,
            some.attempt,
            stage,
            sessions,
            {p: message for p, (_, message) in outgoing.items()},
            peers,
            deadline,
        )

    def _over(self, stage: _Stage) -> bool:
        """The stage waits no more: its deadline passed, or every one present answered."""
        if self._board.now() >= stage.deadline_s:
            return True
        # Absent now, missing from the attempt for a known reason (joined late, left...), or
        # sitting it out: none of them will answer.
        board = self._board
        gone = set(self._liveness.absent_now()) | set(board.absence) | set(board.abstained)
        return all(p in stage.answered or p in gone for p in stage.outgoing)

    def present(self) -> set[str]:
        """Who trained the open attempt and is still present: its groups are drawn from them.

        A participant watches the attempt's stages (``MaskingStages``) once it has trained, so
        this waits until every participant present now watches, or is gone (absent, missing for
        a known reason, sitting the attempt out), or the attempt's deadline passed, as the
        ``advertise`` stage would; one that has not trained by then is not present.

        Raises:
            ShutdownRequested: The coordinator is stopping.
        """
        board = self._board
        with board.cond:
            opening = board.opening
            end = opening.deadline_s if opening is not None else board.now()
            while True:
                board.check_stop()
                gone = set(self._liveness.absent_now()) | set(board.absence) | set(board.abstained)
                waiting = set(board.expected) - gone - self._ready
                remaining = end - board.now()
                if not waiting or remaining <= 0:
                    return set(self._ready) - gone
                board.cond.wait(min(RECHECK_S, remaining))

    def reports(self) -> dict[str, dict[str, str]]:
        """What each participant reported with its masked vector, in the open attempt."""
        with self._board.cond:
            return {pid: dict(report) for pid, report in self._reports.items()}

    def attempt_closed(self) -> None:
        """The attempt is over: wake every stage watcher so it says so (caller holds the lock)."""
        self._stage = None
        self._reports = {}
        self._ready = set()
        self._board.cond.notify_all()

    # ---------------------------------------------------------------- handler threads
    def next_message(
        self,
        participant: str,
        round_index: int,
        attempt: int,
        until_s: float,
        alive: Callable[[], bool] = lambda: True,
    ) -> StageMessage | None:
        """The next stage message for ``participant`` in the attempt, or None.

        None at ``until_s`` (the watcher's window), as soon as the attempt is no longer the open
        one (:meth:`attempt_open` then says so), or once ``alive`` says the watcher's call is
        gone: a message is handed out (and counted delivered) only to a live call.
        """
        board = self._board
        with board.cond:
            while True:
                stage = self._stage
                if not board.is_open(round_index, attempt) or board.stopping or not alive():
                    return None
                if participant not in self._ready:
                    self._ready.add(participant)  # it trained: present for the groups
                    board.cond.notify_all()
                if (
                    stage is not None
                    and (stage.round_index, stage.attempt) == (round_index, attempt)
                    and participant in stage.outgoing
                    and participant not in stage.delivered
                ):
                    stage.delivered.add(participant)
                    payload = stage.outgoing[participant]
                    self.bytes_down += len(payload)
                    session = stage.sessions[participant]
                    peers = dict(stage.peers.get(session, {}))
                    return StageMessage(session, stage.stage, payload, peers, stage.deadline_s)
                remaining = until_s - board.now()
                if remaining <= 0:
                    return None
                board.cond.wait(min(remaining, RECHECK_S))

    def attempt_open(self, round_index: int, attempt: int) -> bool:
        """True while ``(round_index, attempt)`` is the open attempt (no lock)."""
        return self._board.is_open(round_index, attempt) and not self._board.stopping

    def precheck(self, participant: str, session: SessionKey, stage: str) -> Rejection | None:
        """Why an answer of ``participant`` to ``stage`` of ``session`` is refused, or None."""
        with self._board.cond:
            return self._refusal(participant, session, stage)

    def _refusal(self, participant: str, session: SessionKey, stage: str) -> Rejection | None:
        current = self._board.collecting_round
        if stage not in STAGES:
            return Rejection(
                nerr.UNKNOWN_STAGE,
                f"{stage[:32]!r} is not a secure-aggregation stage; use one of "
                f"{', '.join(STAGES)}.",
                current,
            )
        collected = self._stage
        if collected is None or session not in collected.sessions.values():
            return Rejection(
                nerr.UNKNOWN_SESSION,
                f"round {session.round_index} attempt {session.attempt} group {session.group} "
                "is not the session being collected.",
                current,
            )
        if collected.stage != stage:
            return Rejection(
                nerr.CLOSED_STAGE,
                f"the session collects {collected.stage!r} answers, not {stage!r}.",
                current,
            )
        if participant not in collected.delivered or collected.sessions[participant] != session:
            return Rejection(
                nerr.NOT_ADDRESSED,
                f"{participant} was not sent a {stage!r} message in this session.",
                current,
            )
        if participant in collected.answered:
            return Rejection(
                nerr.DUPLICATE_ANSWER,
                f"{participant} already answered {stage!r} in this session; the first stands.",
                current,
            )
        return None

    def land(
        self,
        participant: str,
        session: SessionKey,
        stage: str,
        answer: bytes | memoryview,
        report: Mapping[str, str],
    ) -> Rejection | None:
        """Hand a complete answer to the waiting stage; the refusal when it may not count."""
        with self._board.cond:
            refusal = self._refusal(participant, session, stage)
            if refusal is not None:
                return refusal
            collected = self._stage
            assert collected is not None
            collected.answered.add(participant)
            collected.arrived.append((participant, answer))
            self.bytes_up += len(answer)
            if stage == "mask":
                self._reports[participant] = dict(report)
            self._board.cond.notify_all()
            return None


def _public_key(certificate_pem: bytes) -> object:
    """The public key of a PEM certificate.

    Raises:
        ValueError: ``certificate_pem`` is not a PEM certificate.
    """
    return x509.load_pem_x509_certificate(certificate_pem).public_key()
