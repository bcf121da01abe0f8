"""The coordinator side of the network transport: a ``CoordinatorTransport`` over gRPC.

The federation :class:`~lensemble.federation.coordinator.Coordinator` stays single-threaded and
unchanged: it drives :class:`GrpcCoordinatorTransport` exactly as it drives the in-process
transport. gRPC handler threads (:mod:`lensemble.network.coordinator.service`) never touch the
coordinator; they authenticate the caller, stream payloads in and out, and hand each complete
submission to the coordinator's thread through a queue, then wait (with a deadline) for its
verdict. Update streams land where the coordinator's
:class:`~lensemble.federation.intake.Intake` says (attached with :meth:`attach`).

The transport is one object for both sides of that seam, made of four pieces that share the
round state (:class:`~lensemble.network.coordinator.attempt_board.AttemptBoard`) and its lock:

- admission (:mod:`~lensemble.network.coordinator.admission`): the session, Join and Leave,
  the ``(round, attempt)`` check of an update's header;
- uploads (:mod:`~lensemble.network.coordinator.uploads`): one stream per participant, uploads
  refused for good, abstentions;
- the hand-over (:mod:`~lensemble.network.coordinator.hand_over`): the inbox of complete
  submissions and the verdicts that answer them;
- liveness (:mod:`~lensemble.network.coordinator.liveness`): presence streams, grace periods,
  and who an attempt still waits for, so nobody waits ``round_timeout_s`` for a dead
  participant.

What the transport decides on its own, before the coordinator sees anything (so a hostile or
broken participant costs at most ``network.max_message_bytes`` of memory and never stalls a
round): the caller's identity (``PERMISSION_DENIED``), the coordinator session
(``FAILED_PRECONDITION``, reason ``stale_session``), the round and attempt
(``FAILED_PRECONDITION``, reason ``closed_round``), the declared and received sizes
(``RESOURCE_EXHAUSTED`` / ``INVALID_ARGUMENT``), and abstentions. Everything else (hash,
safetensors header, architecture, NaN/Inf, duplicates) is the coordinator's
:meth:`Coordinator.accept`. Every rejection is counted in the
``lensemble_rejected_submissions_total`` metric by reason.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

from lensemble.config import LensembleConfig
from lensemble.federation.intake import Intake
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.masking import SessionKey
from lensemble.federation.messages import RoundOpening, Submission, Verdict
from lensemble.federation.secagg.identity import VerifyingKey
from lensemble.federation.transport import CoordinatorTransport, Traffic
from lensemble.network.coordinator.admission import Admission, JoinOutcome
from lensemble.network.coordinator.attempt_board import AttemptBoard
from lensemble.network.coordinator.hand_over import HandOver
from lensemble.network.coordinator.liveness import Liveness
from lensemble.network.coordinator.masking_exchange import MaskingExchange
from lensemble.network.coordinator.rejection import Rejection
from lensemble.network.coordinator.round_log import RoundLog
from lensemble.network.coordinator.uploads import Abstention, Uploads
from lensemble.network.shared import transport_errors as nerr
from lensemble.network.shared.logs import event
from lensemble.network.shared.metrics import Metrics

_log = logging.getLogger("lensemble.network.coordinator")


class GrpcCoordinatorTransport(CoordinatorTransport):
    """Coordinator transport whose participants are remote processes.

    Args:
        config: The run's config.
        next_round: The round the coordinator will open next (its model version).
        metrics: Where to count bytes and rejections (a private set by default).
        round_log: The causal order of round events, shared with the coordinator's observer
            (a private one by default).

    Attributes:
        config_hash: The run's config hash, which a participant must join with.
        expected: The run's participant ids.
        intake: Where the handler threads land update streams (the coordinator attaches its
            own before the first round; until then, in memory).
    """

    def __init__(
        self,
        config: LensembleConfig,
        *,
        next_round: int,
        metrics: Metrics | None = None,
        round_log: RoundLog | None = None,
    ) -> None:
        self.config = config
        self.round_log = round_log or RoundLog()
        self.expected = frozenset(config.participant_ids)
        self.metrics = metrics or Metrics()
        self.intake = Intake()
        self._board = AttemptBoard(self.expected, next_round)
        self._liveness = Liveness(
            self._board, grace_s=config.network.rpc_timeout_s, quorum=config.federation.quorum
        )
        self._hand_over = HandOver(self._board, self._liveness, self.metrics)
        self._admission = Admission(config, self._board, self._liveness, self.metrics)
        self._uploads = Uploads(self._board, self._hand_over)
        # Masked rounds: the server sets the masked vectors' timeout once it knows d.
        net = config.network
        self.masking = MaskingExchange(
            self._board,
            self._liveness,
            stage_timeout_s=2 * net.rpc_timeout_s,
            mask_timeout_s=2 * net.rpc_timeout_s,
        )
        self.config_hash = self._admission.config_hash
        self._down = 0
        self.metrics.federation(sorted(self.expected), config.federation.quorum)
        self.metrics.model_version.set(next_round)

    # ------------------------------------------------------------ CoordinatorTransport
    def now(self) -> float:
        """Monotonic clock (seconds)."""
        return self._board.now()

    def attach(self, intake: Intake) -> None:
        """Land update streams through the coordinator's ``intake`` from now on."""
        self.intake = intake

    def wait_for_participants(self, quorum: int, timeout_s: float) -> set[str]:
        """Block until every participant joined or ``timeout_s`` passed; returns who joined.

        Raises:
            ShutdownRequested: :meth:`request_stop` was called meanwhile.
        """
        joined = self._liveness.wait_for_joined(timeout_s)
        outcome = "starting rounds" if len(joined) >= quorum else f"below quorum ({quorum})"
        event(
            _log,
            "participants_joined",
            f"{len(joined)} of {len(self.expected)} participants joined; {outcome}.",
            joined=sorted(joined),
        )
        return joined

    def open_round(self, opening: RoundOpening, model_payload: bytes) -> None:
        """Publish the opening to every watcher and serve its model payload.

        Raises:
            ShutdownRequested: The coordinator is stopping; the round is not opened.
        """
        board = self._board
        with board.cond:
            board.check_stop()
            board.open(opening, model_payload, self._liveness.absent_now())
            board.cond.notify_all()
        self.metrics.round_opened(opening.round_index, opening.attempt)
        size = len(model_payload)
        # Logged after the commit this round's model comes from (RoundLog).
        self.round_log.emit(
            lambda: event(
                _log,
                "round_opened",
                f"round {opening.round_index} attempt {opening.attempt} open: model "
                f"{opening.model_hash[:19]}..., {size} bytes.",
                round=opening.round_index,
                attempt=opening.attempt,
                model_hash=opening.model_hash,
                model_bytes=size,
            )
        )

    def receive(self, until_s: float) -> Submission | None:
        """The next complete submission before ``until_s`` (monotonic), else None.

        None as soon as every participant still present has been judged and quorum is reached.

        Raises:
            ShutdownRequested: :meth:`request_stop` was called; the open round is abandoned
                (nothing was committed; a restarted coordinator reopens it).
        """
        return self._hand_over.receive(until_s)

    def reply(self, submission: Submission, verdict: Verdict) -> None:
        """Hand the verdict to the gRPC handler waiting for it."""
        self._hand_over.reply(submission, verdict)

    def round_closed(self, record: RoundRecord) -> None:
        """Stop collecting: answer whatever is still queued for the closed attempt.

        A queued resend of an update that was counted is answered ``duplicate`` (accepted), as
        the coordinator would answer it; anything else is refused.
        """
        self.round_log.closed(record)  # a commit: later rounds' events wait for its line
        with self._board.cond:
            self._board.close(record)
            self.masking.attempt_closed()
            leftovers, decode_s = self._hand_over.take_leftovers()
        self._hand_over.answer_leftovers(leftovers)
        self.metrics.round_closed(record, sorted(self.expected), deserialize_s=decode_s)

    def round_durable(self, record: RoundRecord) -> None:
        """The attempt's ledger line is durable: committed-round metrics move now.

        Called from the coordinator's commit thread when it writes commits behind.
        """
        self.metrics.round_committed(record)

    def take_traffic(self) -> Traffic:
        """Model bytes streamed, update bytes received, and the slowest contributor's compute."""
        with self._board.cond:
            up, compute = self._hand_over.take_traffic()
            masked = self.masking
            traffic = Traffic(self._down + masked.bytes_down, up + masked.bytes_up, compute)
            self._down = masked.bytes_down = masked.bytes_up = 0
        return traffic

    def masking_identities(self) -> dict[str, VerifyingKey]:
        """Each participant's identity key: the one in the certificate it joined with (mTLS)."""
        return self.masking.identities()

    def exchange(
        self, stage: str, outgoing: Mapping[str, tuple[SessionKey, bytes]]
    ) -> Iterator[tuple[str, bytes | memoryview]]:
        """Hand each participant its stage message; yield the answers until the stage deadline.

        See :meth:`MaskingExchange.exchange`.
        """
        return self.masking.exchange(stage, outgoing)

    def masking_present(self) -> set[str]:
        """Who is present for the open attempt's sessions (:meth:`MaskingExchange.present`)."""
        return self.masking.present()

    def masked_reports(self) -> dict[str, dict[str, str]]:
        """The statistics each participant sent with its masked vector in the open attempt."""
        return self.masking.reports()

    def finish(self) -> None:
        """The run is over: watchers receive the final announcement."""
        with self._board.cond:
            self._board.final = True
            self._board.cond.notify_all()
        self.round_log.release()
        event(_log, "run_over", "all rounds committed; participants may leave.")

    def absence_reasons(self) -> dict[str, str]:
        """Why participants missing from the open (or just closed) attempt are missing.

        ``disconnected`` (its presence stream broke, or it was gone at the opening),
        ``not_joined``, ``left``, ``joined_late`` (it joined while the attempt was open and
        contributes from the next), a transport refusal such as ``too_large``, or the reason
        the participant gave for sitting the attempt out (:meth:`abstain`: ``rank_failure``).
        Participants not listed were present and simply did not submit in time.
        """
        with self._board.cond:
            return dict(self._board.absence)

    # ------------------------------------------------------------------- process control
    def request_stop(self) -> None:
        """Stop gracefully (SIGTERM): the coordinator's thread raises ``ShutdownRequested``.

        Queued submissions and waiting handlers are answered ``UNAVAILABLE`` (reason
        ``shutting_down``), so participants resend to the restarted coordinator.
        """
        with self._board.cond:
            self._board.stopping = True
            doomed = self._hand_over.take_all()
            self._board.cond.notify_all()
        self._hand_over.refuse(doomed, nerr.SHUTTING_DOWN, "the coordinator is shutting down.")

    @property
    def stopping(self) -> bool:
        """True after :meth:`request_stop`."""
        return self._board.stopping

    def all_left(self) -> bool:
        """True once every participant that joined has left."""
        return self._liveness.all_left()

    def wait_all_left(self, timeout_s: float) -> bool:
        """Wait until every joined participant left, at most ``timeout_s`` seconds."""
        return self._liveness.wait_all_left(timeout_s)

    # ------------------------------------------------------------ state for the handlers
    @property
    def session(self) -> str:
        """This process's random id: Join returns it, every later call must carry it.

        So participants notice a restarted coordinator.
        """
        return self._admission.session

    @property
    def collecting_round(self) -> int:
        """The round being collected, or the next one to open."""
        return self._board.collecting_round

    def stale_session(self, session: str) -> Rejection | None:
        """The refusal of a call made with another session than this coordinator's, else None."""
        return self._admission.stale_session(session)

    def join(self, participant_id: str, hash_: str, view_json: str, version: str) -> JoinOutcome:
        """Register a participant whose config hash matches; name the differing fields if not."""
        return self._admission.join(participant_id, hash_, view_json, version)

    def leave(self, participant_id: str, reason: str) -> None:
        """Record that a participant left."""
        self._admission.leave(participant_id, reason)

    def next_announcement(
        self, after: tuple[int, int], until_s: float
    ) -> tuple[RoundOpening, int] | None:
        """The next announcement for a watcher, or None at ``until_s``.

        Returns:
            ``(opening, model bytes)`` for the open round when it is newer than ``after``, or
            ``(final opening, 0)`` once the run is over.
        """
        board = self._board
        with board.cond:
            while True:
                if board.final:
                    last = board.next_round
                    return RoundOpening(last, 0, last, "", 0.0, final=True), 0
                opening = board.opening
                if opening is not None and (opening.round_index, opening.attempt) > after:
                    return opening, len(board.payload)
                remaining = until_s - board.now()
                if remaining <= 0 or board.stopping:
                    return None
                board.cond.wait(remaining)

    def model_payload(self, model_hash: str) -> bytes | None:
        """The open round's model payload when ``model_hash`` is its hash, else None."""
        with self._board.cond:
            opening = self._board.opening
            if opening is None or opening.model_hash != model_hash:
                return None
            return self._board.payload

    def count_down(self, n: int) -> None:
        """Count ``n`` model bytes streamed to a participant."""
        with self._board.cond:
            self._down += n
        self.metrics.bytes_out.inc(n)

    def precheck(self, header: Any) -> Rejection | Verdict | None:
        """Judge an update header before any payload byte is buffered (see ``Admission``)."""
        return self._admission.precheck(header)

    def collects(self, round_index: int, attempt: int) -> bool:
        """True while ``(round_index, attempt)`` is the attempt being collected (no lock)."""
        return self._board.is_open(round_index, attempt)

    def begin_upload(self, participant_id: str) -> bool:
        """Reserve the participant's single upload slot; False when one is already streaming."""
        return self._uploads.begin_upload(participant_id)

    def end_upload(self, participant_id: str) -> None:
        """Release the slot taken by :meth:`begin_upload`."""
        self._uploads.end_upload(participant_id)

    def submit(
        self, submission: Submission, compute_s: float, timeout_s: float
    ) -> Verdict | Rejection:
        """Queue a complete submission and wait for its verdict (see ``HandOver.submit``)."""
        return self._hand_over.submit(submission, compute_s, timeout_s)

    def presence_opened(self, participant: str) -> None:
        """A presence stream of ``participant`` opened."""
        self._liveness.presence_opened(participant)

    def presence_closed(self, participant: str, broken: bool) -> None:
        """A presence stream ended; ``broken``: it did not end at its window (peer gone)."""
        self._liveness.presence_closed(participant, broken)

    def upload_refused(self, participant: str, round_index: int, attempt: int, reason: str) -> None:
        """The transport refused an upload of ``participant`` for good (it will not resend)."""
        self._uploads.upload_refused(participant, round_index, attempt, reason)

    def abstain(
        self, participant: str, round_index: int, attempt: int, reason: str
    ) -> Abstention | Rejection:
        """Record that ``participant`` sits out the open attempt (see ``Uploads.abstain``)."""
        return self._uploads.abstain(participant, round_index, attempt, reason)
