"""The handlers of the masked rounds' two RPCs: ``MaskingStages`` and ``AnswerStage``.

Both are hostile input until checked, in the order of the other handlers: the text fields'
sizes (``oversized_field``), the caller's own identity (``PERMISSION_DENIED``), the coordinator
session (``stale_session``); then, for an answer, the session and stage it claims
(:meth:`MaskingExchange.precheck`: ``unknown_stage``, ``unknown_session``, ``closed_stage``,
``not_addressed``, ``duplicate_answer``), its declared size against the stage's bound from the
config (``too_large``, before any byte is buffered), its statistics (``bad_payload``), its
chunks (``bad_payload``) and its SHA-256 (``hash_mismatch``). The answer's bytes are only ever
parsed by the session's own bounded decoder (:mod:`lensemble.federation.secagg.wire`), never
unpickled. Every refusal is counted by reason like the other RPCs'.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from lensemble.errors import PayloadError
from lensemble.federation.masking import SessionKey
from lensemble.federation.messages import Reason
from lensemble.network.coordinator.call_guard import extend_deadline
from lensemble.network.coordinator.rejection import Rejection
from lensemble.network.shared import transport_errors as nerr
from lensemble.network.shared.masking_limits import MASKING_TEXT_LIMITS, bad_report
from lensemble.network.shared.peer_text import oversized_field
from lensemble.network.shared.proto import lensemble_pb2 as pb
from lensemble.network.shared.streams import Assembler, TooLarge, chunk_count

if TYPE_CHECKING:
    from lensemble.network.coordinator.service import CoordinatorService

#: The gRPC auth-context key holding the PEM of the verified client certificate.
PEM_CERT_KEY = "x509_pem_cert"


def remember_certificate(service: CoordinatorService, participant: str, context: Any) -> None:
    """Keep the certificate a joining participant's mTLS handshake presented (masked runs)."""
    if service.transport.config.federation.aggregation != "masking":
        return
    pems = context.auth_context().get(PEM_CERT_KEY, ())
    if pems:
        service.transport.masking.remember(participant, bytes(pems[0]))


class MaskingService:
    """The masked rounds' handlers, next to :class:`CoordinatorService` (whose checks they use).

    Args:
        service: The servicer: its caller checks, its refusals, its transport.
        answer_limits: Stage -> largest answer accepted (bytes; see
            :func:`lensemble.network.shared.masking_limits.answer_limits`).
    """

    def __init__(self, service: CoordinatorService, answer_limits: Mapping[str, int]) -> None:
        self.service = service
        self.transport = service.transport
        self.limits = dict(answer_limits)
        self.window_s = service.rpc_timeout_s

    def _checked(self, context: Any, fields: Mapping[str, str], rpc: str) -> None:
        """Refuse oversized text, another participant's id, or a stale session."""
        too_long = oversized_field(
            {k: v for k, v in fields.items() if k in MASKING_TEXT_LIMITS}, MASKING_TEXT_LIMITS
        )
        if too_long is not None:
            rejection = Rejection(nerr.OVERSIZED, too_long, self.transport.collecting_round)
            self.service._abort(context, rejection, rpc=rpc)
        self.service._authorize(context, fields["participant_id"], rpc)
        self.service._check_session(context, fields["session"], rpc)

    def MaskingStages(
        self, request: pb.MaskingStagesRequest, context: Any
    ) -> Iterator[pb.MaskingStage]:
        """Stream the caller's next stage message of one attempt, within a window (see the proto).

        At most one message per call: the participant handles it with no call open, then asks
        again, so no message is ever handed to a call whose caller has stopped reading.
        """
        fields = {"participant_id": request.participant_id, "session": request.session}
        self._checked(context, fields, "MaskingStages")
        exchange = self.transport.masking
        pid, key = request.participant_id, (request.round_index, request.attempt)
        end = self.transport.now() + self.window_s
        message = exchange.next_message(pid, *key, end, alive=context.is_active)
        if message is None:
            if not exchange.attempt_open(*key):
                yield pb.MaskingStage(round_index=key[0], attempt=key[1], closed=True)
            return
        yield pb.MaskingStage(
            round_index=message.session.round_index,
            attempt=message.session.attempt,
            group=message.session.group,
            stage=message.stage,
            payload=message.payload,
            peers=[
                pb.PeerCertificate(participant_id=p, certificate_pem=pem)
                for p, pem in sorted(message.peers.items())
            ],
            deadline_in_s=max(0.0, message.deadline_s - self.transport.now()),
        )

    def AnswerStage(
        self, request_iterator: Iterator[pb.MaskingAnswerChunk], context: Any
    ) -> pb.MaskingAnswerReply:
        """Receive one stage answer in chunks and hand it to the session being collected."""
        rpc = "AnswerStage"
        current = self.transport.collecting_round
        first = next(request_iterator, None)
        if first is None or not first.HasField("header"):
            rejection = Rejection(
                Reason.BAD_PAYLOAD.value, "the answer did not start with a header chunk.", current
            )
            self.service._abort(context, rejection, rpc=rpc)
        header = first.header
        fields = {
            "participant_id": header.participant_id,
            "session": header.session,
            "stage": header.stage,
        }
        self._checked(context, fields, rpc)
        pid = header.participant_id
        session = SessionKey(header.round_index, header.attempt, header.group)
        early = self.transport.masking.precheck(pid, session, header.stage)
        if early is not None:
            self.service._abort(context, early, rpc=rpc)
        why = bad_report(header.report)
        if why is not None:
            self.service._abort(context, Rejection(Reason.BAD_PAYLOAD.value, why, current), rpc=rpc)
        answer = self._assembled(first, request_iterator, context)
        refusal = self.transport.masking.land(
            pid, session, header.stage, answer, dict(header.report)
        )
        if refusal is not None:
            self.service._abort(context, refusal, rpc=rpc)
        return pb.MaskingAnswerReply(outcome="accepted", current_round=current)

    def _assembled(
        self, first: pb.MaskingAnswerChunk, rest: Iterator[pb.MaskingAnswerChunk], context: Any
    ) -> bytes | memoryview:
        """The answer's bytes, size-bounded before buffering and hash-checked.

        A large answer (a masked vector) lands in a spool file as its chunks arrive, like an
        update stream, and is handed on as a read-only view of that file: N vectors uploading at
        once are not N vectors in memory, and the session adds each into its running sum and
        lets the file go (issue 37). Nothing reaches the session before its hash is checked, so
        a refused answer is never partly in the sum.
        """
        header = first.header
        current = self.transport.collecting_round
        what = f"the {header.stage!r} answer of {header.participant_id}"
        try:
            assembler = Assembler(
                header.total_bytes,
                self.limits[header.stage],
                what,
                land=self.transport.intake.land,
            )
        except TooLarge as exc:
            rejection = Rejection(Reason.TOO_LARGE.value, str(exc), current)
            self.service._abort(context, rejection, rpc="AnswerStage")
        chunk_bytes = self.service.chunk_bytes
        extend_deadline(
            context,
            self.service.rpc_timeout_s * (chunk_count(header.total_bytes, chunk_bytes) + 2),
        )
        try:
            assembler.add(first.data)
            for chunk in rest:
                if chunk.HasField("header"):
                    raise PayloadError(f"{what} carries a second header chunk.")
                assembler.add(chunk.data)
                del chunk  # its frame goes now, not when the next one has arrived
            answer = assembler.finish()
        except PayloadError as exc:
            rejection = Rejection(Reason.BAD_PAYLOAD.value, str(exc), current)
            self.service._abort(context, rejection, rpc="AnswerStage")
        except OSError as exc:  # the spool file it landed in: the coordinator's disk, not the
            # sender's fault; the answer is only not received (the session counts a dropout)
            rejection = Rejection(
                nerr.BUSY,
                f"the coordinator could not write {what} to its spool folder "
                f"({exc.strerror or exc}).",
                current,
            )
            self.service._abort(context, rejection, rpc="AnswerStage")
        if assembler.payload_hash != header.payload_hash:
            rejection = Rejection(
                Reason.HASH_MISMATCH.value,
                f"{what} hashes to {assembler.payload_hash[:19]}..., the sender declared "
                f"{header.payload_hash[:19]}...",
                current,
            )
            self.service._abort(context, rejection, rpc="AnswerStage")
        return answer
