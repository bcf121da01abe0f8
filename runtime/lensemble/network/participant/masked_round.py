"""A participant's masked rounds over gRPC: hold the update, answer each stage, upload answers.

Under ``federation.aggregation: masking`` a participant that trained an attempt never uploads its
update in clear. :meth:`MaskedRounds.take_part` keeps it in a
:class:`~lensemble.federation.masking_client.MaskingClient` (as the in-process transport does),
watches the attempt's stage messages (``MaskingStages``) and uploads each answer in chunks
(``AnswerStage``) until it answered ``unmask`` or the coordinator says the attempt is over. Its
identity key is its own mTLS key, its secret seed derives from it
(:mod:`lensemble.network.participant.peer_keys`), and its peers' keys come from the certificates
the coordinator relays with ``advertise``, each checked against this participant's CA: one that
fails makes the participant refuse the session (it answers nothing; the session counts it as
dropped), so the coordinator cannot substitute a key. It advertises in one session per attempt
at most (with several groups the ``advertise`` message carries the attempt's present set, which
its :class:`~lensemble.federation.masking_client.MaskingClient` checks). Nothing received is
ever unpickled: stage messages are parsed by :mod:`lensemble.federation.secagg.wire`'s bounded
decoders.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np

from lensemble.config import LensembleConfig
from lensemble.federation.masking import SessionKey, flatten
from lensemble.federation.masking_client import MaskingClient, SignedRounds
from lensemble.federation.messages import RoundOpening
from lensemble.federation.participant import Contribution
from lensemble.federation.payload import TensorSpec, decode
from lensemble.federation.quantization import dequantize
from lensemble.federation.secagg.driver import STAGES
from lensemble.network.participant.call_errors import CallError, Failure, classify
from lensemble.network.participant.client import CoordinatorClient
from lensemble.network.participant.peer_keys import (
    PeerCertificateRefused,
    own_identity,
    secret_seed,
    trusted_authorities,
    trusted_peer_keys,
)
from lensemble.network.shared.logs import event
from lensemble.network.shared.peer_text import shown
from lensemble.network.shared.proto import lensemble_pb2 as pb
from lensemble.network.shared.streams import chunk_count, chunks, first_message

_log = logging.getLogger("lensemble.network.participant")

#: The statistics a masked vector carries along (the keys the coordinator's ledger reads of a
#: payload's metadata: ``lensemble.federation.admission.SELF_REPORTED_RANGES``).
REPORTED = ("mean_loss", "compute_s", "heldout_loss")

#: ``(what failed, the classified error)``: the participant loop's handling of a failed call
#: (rejoin, back off, or raise).
OnError = Callable[[str, CallError], None]


@dataclass
class _Attempt:
    """One attempt's masked state: the held update, its report, the client once keys are in."""

    opening: RoundOpening
    update: np.ndarray
    report: dict[str, str]
    client: MaskingClient | None = None
    advertised: bool = False
    done: bool = False
    completed: bool = False


class MaskedRounds:
    """This participant's side of every masked attempt it trains.

    Args:
        config: The run's config (``federation.aggregation: masking``, mTLS).
        client: Calls to the coordinator (its channel, session and metadata).
        architecture: The global model's tensor specs (d and the vector layout).
        stop: Set to stop (the loop's stop event).
        signed_record: The file of the survivor sets this participant signed
            (:mod:`lensemble.federation.signed_rounds`); None keeps them in memory only.

    Attributes:
        silent: ``(session, stage) -> True`` to answer nothing from then on (tests make a
            participant drop out at a stage with it); never set in production.
        refusals: Every refusal of this participant's sessions (peer certificates included).

    Raises:
        ConfigError: The TLS key or CA file is unusable for masking.
    """

    def __init__(
        self,
        config: LensembleConfig,
        client: CoordinatorClient,
        architecture: Mapping[str, TensorSpec],
        stop: threading.Event,
        signed_record: Path | None = None,
    ) -> None:
        self.config = config
        self.client = client
        self.architecture = dict(architecture)
        self.stop = stop
        self.key = own_identity(config, client.id)
        self.seed = secret_seed(self.key, config)
        self.authorities = trusted_authorities(config, client.id)
        self.silent: Callable[[SessionKey, str], bool] = lambda key, stage: False
        self.refusals: list[str] = []
        #: The survivor set signed last, across every attempt's client and restarts: one per
        #: round.
        self.signed = SignedRounds(signed_record)

    # ------------------------------------------------------------------------ the attempt
    def take_part(
        self, opening: RoundOpening, contribution: Contribution, on_error: OnError
    ) -> bool:
        """Hold ``contribution``'s update and answer the attempt's stages until it is over.

        Returns:
            True when this participant answered every stage to the last (``unmask``).

        Raises:
            Whatever ``on_error`` raises (denied credentials, coordinator unreachable).
        """
        update, report = self._held(contribution)
        state = _Attempt(opening, update, report)
        where = f"round {opening.round_index} attempt {opening.attempt}"
        while not state.done and not self.stop.is_set():
            try:
                message = self._next_stage(opening)
            except grpc.RpcError as exc:
                error = classify(exc)
                on_error(f"watching the masked stages of {where}", error)
                if error.kind not in (Failure.TRANSIENT, Failure.STALE_SESSION):
                    return state.completed
                continue
            if message is not None and message.closed:
                state.done = True
            elif message is not None:  # handled with no call open: it may take its time
                self._handle(state, message, on_error)
        event(
            _log,
            "masked",
            f"masked stages of {where} over; {len(self.refusals)} refusal(s) so far.",
            round=opening.round_index,
            attempt=opening.attempt,
        )
        return state.completed

    def _held(self, contribution: Contribution) -> tuple[np.ndarray, dict[str, str]]:
        """The update as the flat float vector the session masks, and the statistics reported."""
        decoded = decode(contribution.payload)
        fed = self.config.federation
        tensors = dequantize(decoded.tensors, self.architecture, fed.quantization, 0)
        report = {k: v for k, v in decoded.metadata.items() if k in REPORTED}
        return flatten(tensors, self.architecture), report

    def _next_stage(self, opening: RoundOpening) -> pb.MaskingStage | None:
        """The attempt's next stage message, or None when the coordinator's window ended.

        Raises:
            grpc.RpcError: The call failed.
        """
        client = self.client
        call = client.stub.MaskingStages(
            pb.MaskingStagesRequest(
                participant_id=client.id,
                session=client.session,
                round_index=opening.round_index,
                attempt=opening.attempt,
            ),
            timeout=client.timeout_s * 2,
            metadata=client.metadata,
        )
        return first_message(call)  # type: ignore[no-any-return]

    def _handle(self, state: _Attempt, message: pb.MaskingStage, on_error: OnError) -> None:
        """Answer one stage message (when this participant may and can) and upload the answer."""
        key = SessionKey(message.round_index, message.attempt, message.group)
        stage = message.stage
        if stage not in STAGES or (key.round_index, key.attempt) != (
            state.opening.round_index,
            state.opening.attempt,
        ):
            self.refusals.append(f"unknown_stage: {shown(stage, 40)}")
            return
        if stage == "advertise":
            if state.advertised:
                # One session per attempt: its update never enters two sums (another group, or
                # the same group under another present set, gets no answer).
                self.refusals.append(
                    f"second_session: round {key.round_index} attempt {key.attempt} group "
                    f"{key.group}, after another session of the attempt"
                )
                return
            state.advertised = True
            state.client = self._client_for(state, message)
        if state.client is None or self.silent(key, stage):
            return
        answer = state.client.answer(key, stage, message.payload)
        if answer is None:
            refused = state.client.refusals
            if refused:
                self.refusals.append(f"{refused[-1].reason.value}: {shown(str(refused[-1]))}")
            return
        report = state.report if stage == "mask" else {}
        # The coordinator's word on its deadline, capped by the config's (it is peer input).
        wait_s = min(message.deadline_in_s, self.config.federation.round_timeout_s)
        deadline = time.monotonic() + max(0.0, wait_s)
        self._upload(key, stage, answer, report, deadline=deadline, on_error=on_error)
        if stage == "unmask":
            state.done = state.completed = True

    def _client_for(self, state: _Attempt, message: pb.MaskingStage) -> MaskingClient | None:
        """A masking client whose peers' keys are the relayed certificates', each checked."""
        certificates = {p.participant_id: bytes(p.certificate_pem) for p in message.peers}
        try:
            verifiers = trusted_peer_keys(certificates, self.authorities)
        except PeerCertificateRefused as refusal:
            self.refusals.append(f"peer_certificate: {refusal}")
            event(
                _log,
                "masking_refused",
                f"refusing the masked session: {shown(str(refusal))}",
                logging.ERROR,
                round=message.round_index,
                participant=refusal.participant,
            )
            return None
        client = MaskingClient(
            self.config,
            self.client.id,
            seed=self.seed,
            identity_key=self.key,
            verifiers=verifiers,
            architecture=self.architecture,
            signed=self.signed,
        )
        client.hold(state.opening.round_index, state.opening.attempt, state.update)
        return client

    # --------------------------------------------------------------------------- upload
    def _upload(
        self,
        key: SessionKey,
        stage: str,
        answer: bytes,
        report: Mapping[str, str],
        *,
        deadline: float,
        on_error: OnError,
    ) -> None:
        """Upload one answer, resending on transient failures until the stage's deadline."""
        where = f"the {stage!r} answer of round {key.round_index} attempt {key.attempt}"
        while not self.stop.is_set():
            try:
                self.answer(key, stage, answer, report)
                return
            except grpc.RpcError as exc:
                error = classify(exc)
                if error.reason == "duplicate_answer":
                    return  # an earlier send landed; its reply was lost
                if error.kind == Failure.TRANSIENT and time.monotonic() < deadline:
                    self.stop.wait(0.2)
                    continue
                if error.kind in (Failure.TRANSIENT, Failure.STALE_SESSION, Failure.DENIED):
                    on_error(f"uploading {where}", error)
                else:
                    _log.warning("%s was refused: %s", where, error)
                return

    def answer(
        self, key: SessionKey, stage: str, answer: bytes, report: Mapping[str, str]
    ) -> pb.MaskingAnswerReply:
        """Send one answer in chunks of ``network.chunk_bytes`` (one call).

        Raises:
            grpc.RpcError: The call failed or was refused (the reason in its metadata).
        """
        client = self.client
        header = pb.MaskingAnswerHeader(
            participant_id=client.id,
            session=client.session,
            round_index=key.round_index,
            attempt=key.attempt,
            group=key.group,
            stage=stage,
            total_bytes=len(answer),
            payload_hash="sha256:" + hashlib.sha256(answer).hexdigest(),
            report=dict(report),
        )

        def stream() -> Iterator[pb.MaskingAnswerChunk]:
            yield pb.MaskingAnswerChunk(header=header)
            for view in chunks(answer, client.chunk_bytes):
                client.metrics.bytes_out.inc(len(view))
                yield pb.MaskingAnswerChunk(data=bytes(view))

        count = chunk_count(len(answer), client.chunk_bytes)
        reply: pb.MaskingAnswerReply = client.stub.AnswerStage(
            stream(), timeout=client.timeout_s * (count + 2), metadata=client.metadata
        )
        return reply
