"""A participant: verifies the global model, trains locally, and releases a pseudo-gradient.

The participant does not know which transport carries it. A transport driver hands it each
:class:`~lensemble.federation.messages.RoundOpening` with the model payload bytes it fetched, and
sends back the payload bytes :meth:`Participant.contribute` returns. Those bytes are produced
only by the residency guard, so nothing but a model-shaped pseudo-gradient can leave.

With its update it reports the held-out loss of the model it received, computed by its learner
on its own held-out split (``heldout_loss`` metadata; the coordinator's divergence guard,
:mod:`lensemble.federation.guard`, reads the median of the reports). A participant given attack
faults (:meth:`Participant.take_faults`) tampers with its own update and report as a
compromised one would (:mod:`lensemble.federation.attacks`), on every transport alike.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from lensemble.config import LensembleConfig
from lensemble.errors import IntegrityError, PayloadError
from lensemble.federation.attacks import Attacker
from lensemble.federation.checkpoint import InnerStateStore, unusable_inner_state
from lensemble.federation.diloco import pseudo_gradient
from lensemble.federation.fault_kinds import ATTACK_KINDS
from lensemble.federation.faults import FaultPlan
from lensemble.federation.messages import RoundOpening
from lensemble.federation.overlap import OverlapState
from lensemble.federation.payload import (
    TensorSpec,
    bytes_hash,
    check_architecture,
    decode,
    model_hash,
)
from lensemble.federation.quantization import quantize, wire_specs
from lensemble.federation.residency import ResidencyGuard
from lensemble.federation.signed_rounds import record_path
from lensemble.learner import Learner, LocalRound


@dataclass(frozen=True)
class _Ahead:
    """Inner steps of an overlapped round trained before its announcement (see train_ahead).

    ``local`` is None when that training failed: the learner's state moved on all the same.
    """

    round_index: int
    base_hash: str
    local: LocalRound | None
    compute_s: float


@dataclass(frozen=True)
class Contribution:
    """What a participant hands its transport for one round.

    Attributes:
        payload: Safetensors bytes sealed by the residency guard.
        payload_hash: ``sha256:<hex>`` of ``payload``.
        mean_loss: Mean inner loss (unitless).
        compute_s: Time in the inner steps (seconds).
        serialize_s: Time quantizing and sealing the pseudo-gradient (seconds).
        deserialize_s: Time decoding and verifying the global model (seconds).
        heldout_loss: The held-out loss of the received model as reported (unitless), or
            None when the learner has no held-out split.
        privacy_epsilon: The differential-privacy epsilon spent after this round, as
            reported (unitless), or None without differential privacy.
    """

    payload: bytes
    payload_hash: str
    mean_loss: float
    compute_s: float
    serialize_s: float = 0.0
    deserialize_s: float = 0.0
    heldout_loss: float | None = None
    privacy_epsilon: float | None = None


def verify_model_payload(
    data: bytes, expected_hash: str, architecture: Mapping[str, TensorSpec] | None = None
) -> tuple[dict[str, torch.Tensor], int]:
    """Decode a global-model payload and check it hashes to ``expected_hash``.

    Returns:
        ``(params, version)``.

    Raises:
        IntegrityError: The payload is corrupt or its hash differs (never train on it).
    """
    try:
        decoded = decode(data)
        version = int(decoded.metadata.get("version", "-1"))
        parent = decoded.metadata.get("parent_hash", "")
        if architecture is not None:
            check_architecture(decoded.tensors, architecture, what="the global model")
    except (PayloadError, ValueError) as exc:
        raise IntegrityError(
            f"the global model payload is unusable ({exc});",
            remediation="the coordinator or the network corrupted it; the participant will "
            "fetch it again.",
        ) from None
    actual = model_hash(decoded.tensors, version, parent)
    if actual != expected_hash:
        raise IntegrityError(
            f"the global model hashes to {actual[:19]}..., the round announced "
            f"{expected_hash[:19]}...;",
            remediation="refusing to train on a model that is not the committed one.",
        )
    return decoded.tensors, version


class Participant:
    """One participant of the federation.

    Args:
        config: The run's config.
        participant_id: This participant's id (must be in the config).
        learner: Its local training (keeps inner optimizer state across rounds, as DiLoCo).
        architecture: The global model's tensor specs (from the initial parameters).
        output_dir: Root of run output; inner-state snapshots go under
            ``participants/<id>/state`` (None disables them).
    """

    def __init__(
        self,
        config: LensembleConfig,
        participant_id: str,
        learner: Learner,
        architecture: Mapping[str, TensorSpec],
        output_dir: Path | None = None,
    ) -> None:
        config.participant(participant_id)  # KeyError for an unknown id
        self.config = config
        self.id = participant_id
        self.learner = learner
        self.architecture = dict(architecture)
        fed = config.federation
        self.guard = ResidencyGuard(
            participant_id,
            wire_specs(self.architecture, fed.quantization, fed.int8_chunk),
            enforced=config.data.residency_enforced,
        )
        self.states = InnerStateStore(output_dir, participant_id) if output_dir else None
        self._trained: tuple[int, int] | None = None
        # contribute(snapshot_behind=True): the inner-state snapshot still being written.
        self._snapshot: Future[None] | None = None
        self._writer: ThreadPoolExecutor | None = None
        #: The attacks this participant makes on itself (None: an honest participant).
        self.attacker: Attacker | None = None
        #: What an overlapped round's base needs (federation.overlap).
        self.overlap = OverlapState(config)
        self._ahead: _Ahead | None = None
        #: The latest attempt's training: a retry of its round from the same model reuses it.
        self._last: tuple[int, str, LocalRound] | None = None
        #: Under masking, the file of the survivor sets it signed, beside its inner state (None
        #: without an output folder: kept in memory only).
        self.masking_record = record_path(self.states.folder if self.states else None)

    def take_faults(self, plan: FaultPlan) -> None:
        """Become the compromised participant ``plan`` makes of this one, if it attacks.

        Args:
            plan: A fault plan; its attack and ``misreport`` entries naming this participant
                are kept (``plan.hostile`` counts the colluders).
        """
        kinds = ATTACK_KINDS | {"misreport"}
        own = tuple(f for f in plan.faults if f.participant == self.id and f.kind in kinds)
        if own:
            self.attacker = Attacker(
                FaultPlan(own, colluders=plan.hostile),
                self.id,
                len(self.config.participant_ids),
                self.config.federation.outer_optimizer,
            )

    def settle_snapshot(self) -> None:
        """Wait until the last inner-state snapshot is durable; re-raise its error.

        A transport that lets the snapshot be written behind (``contribute(...,
        snapshot_behind=True)``) calls this before the last byte of the update leaves, so an
        update is never counted without the inner state that produced it on disk.

        Raises:
            DiskFull, DiskError: The snapshot could not be written.
        """
        pending, self._snapshot = self._snapshot, None
        if pending is not None:
            pending.result()

    def restore(self, round_index: int, attempt: int = 0) -> bool:
        """Put the inner state back to just before training ``(round_index, attempt)``.

        Used on resume, on rejoin, and when a restarted coordinator reopens a round this
        participant already trained: the retraining then reproduces the same pseudo-gradient.

        Returns:
            True when a snapshot was loaded; False when none exists (the learner is reset to
            its initial inner state) or snapshots are disabled.

        Raises:
            IntegrityError: The snapshot is corrupt or of another model (names the file and
                the fix).
        """
        if self.states is None:
            return False
        self.settle_snapshot()
        self._ahead = self._last = None  # trained from the state being replaced
        found = self.states.latest_before(round_index, attempt)
        try:
            self.learner.load_inner_state(found[1] if found else {})
        except IntegrityError as exc:  # names and shapes of another model: name the file
            assert found is not None  # an empty state always loads
            raise unusable_inner_state(self.states.path(*found[0]), exc.message) from None
        self._trained = found[0] if found else None
        return found is not None

    def forget(self, round_index: int, attempt: int) -> bool:
        """Undo the training of ``(round_index, attempt)``, whose update was not taken.

        An update lost on the way (a cut network, a deadline passed) or refused leaves this
        participant as if it had been absent from that round, which is what the coordinator's
        record says: its inner state goes back to before the round and that round's snapshot
        is deleted. So the hash chain depends on who contributed, never on who trained in vain
        (the same chain as an in-process run with ``drop`` at the same rounds).

        Returns:
            True when the state was rewound; False with snapshots disabled (nothing to go back
            to) or when this participant did not train that round last.
        """
        self.overlap.forget(round_index, attempt)
        if self.states is None or self._trained != (round_index, attempt):
            return False
        self.settle_snapshot()  # a snapshot still being written would outlive the discard
        self.states.discard(round_index, attempt)
        self.restore(round_index, attempt)
        return True

    def _metadata(
        self,
        opening: RoundOpening,
        mean_loss: float,
        compute_s: float,
        heldout: float | None,
        privacy_epsilon: float | None = None,
    ) -> dict[str, str]:
        """The update's metadata: what it is for, and the statistics this participant reports."""
        fed = self.config.federation
        metadata = {
            "kind": "pseudo-gradient",
            "round": str(opening.round_index),
            "attempt": str(opening.attempt),
            "participant": self.id,
            "base_hash": opening.trains_from,
            "quantization": fed.quantization,
            "int8_chunk": str(fed.int8_chunk),
            "mean_loss": repr(float(mean_loss)),
            "compute_s": f"{compute_s:.6f}",
        }
        if heldout is not None:
            metadata["heldout_loss"] = repr(float(heldout))
        if privacy_epsilon is not None:
            metadata["privacy_epsilon"] = repr(float(privacy_epsilon))
        return metadata

    def _train(
        self, opening: RoundOpening, base: Mapping[str, torch.Tensor]
    ) -> tuple[LocalRound, float]:
        """The attempt's inner steps from ``base``, or those already run for it.

        Those :meth:`train_ahead` ran, or, for a retry of the round this participant trained
        last from the same model, that training (no inner step twice, so a retry costs no
        training and the inner state is as if the round was trained once; compute 0 s).
        """
        last = self._last
        if last is not None and last[:2] == (opening.round_index, opening.trains_from):
            return last[2], 0.0
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            if ahead.local is not None and (ahead.round_index, 0, ahead.base_hash) == (
                opening.round_index,
                opening.attempt,
                opening.trains_from,
            ):
                return ahead.local, ahead.compute_s
            # Trained for another attempt or base: back to the state before this attempt.
            self.restore(opening.round_index, opening.attempt)
        start = time.perf_counter()
        local = self.learner.train_round(
            base, opening.round_index, self.config.federation.inner_steps
        )
        self._last = (opening.round_index, opening.trains_from, local)
        return local, time.perf_counter() - start

    def train_ahead(self, sent: RoundOpening) -> bool:
        """Under ``federation.overlap`` ``one_round``, run the next round's inner steps now.

        Called right after this participant's update of ``sent`` is sealed, while it travels:
        the next round (attempt 0) will train from ``sent``'s model plus this participant's
        own progress (:mod:`lensemble.federation.overlap`), all of which it holds already.
        :meth:`contribute` of that attempt takes the result when its announcement names that
        base, and otherwise rewinds the inner state and trains as usual, so the update is the
        same bits either way. Nothing else may use this participant while it runs.

        Returns:
            True when it trained (or tried to); False when the overlap is off, inner-state
            snapshots are disabled (without them a discarded training could not be undone) or
            ``sent`` is the run's last round.
        """
        if not self.overlap.enabled or self.states is None:
            return False
        if sent.round_index + 1 >= self.config.federation.rounds:
            return False  # the run's last round: nothing comes after it
        # Not settle_snapshot(): the transport settles the snapshot of ``sent`` before its last
        # byte leaves (that snapshot holds copies, so training on now cannot change it).
        guess = RoundOpening(
            round_index=sent.round_index + 1,
            attempt=0,
            model_version=sent.model_version + 1,
            model_hash="",
            deadline_s=0.0,
            base_hash=sent.model_hash,
        )
        local: LocalRound | None = None
        start = time.perf_counter()
        try:
            base = self.overlap.base(guess, {})
            local = self.learner.train_round(
                base, guess.round_index, self.config.federation.inner_steps
            )
        except Exception:  # contribute() retrains, and meets the same error where it is handled
            local = None
        self._ahead = _Ahead(guess.round_index, sent.model_hash, local, time.perf_counter() - start)
        return True

    def _save_state(self, opening: RoundOpening, behind: bool) -> None:
        """Snapshot the inner state after ``opening``'s attempt; on a thread when ``behind``."""
        if self.states is None:
            return
        # inner_state() returns copies, taken now: later training cannot change them.
        state = self.learner.inner_state()
        if not behind:
            self.states.save(opening.round_index, opening.attempt, state)
            return
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="lensemble-snapshot")
        self._snapshot = self._writer.submit(
            self.states.save, opening.round_index, opening.attempt, state
        )

    def contribute(
        self,
        opening: RoundOpening,
        model_payload: bytes,
        *,
        snapshot_behind: bool = False,
        peers: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
    ) -> Contribution:
        """Score the round's global model, train on local data from it, seal the update.

        Args:
            opening: The round being collected.
            model_payload: The global model's payload, as fetched.
            snapshot_behind: Write the inner-state snapshot on a thread while the caller
                sends the update; the caller must call :meth:`settle_snapshot` before the
                update's last byte leaves. False returns with the snapshot durable.
            peers: The other participants' honest updates of this attempt, for an omniscient
                attack (the in-process transport's; None otherwise).

        Returns:
            The sealed payload and its statistics.

        Raises:
            IntegrityError: The model payload does not match ``opening.model_hash``.
            ResidencyViolation: The outgoing payload is not a model-shaped pseudo-gradient.
            PayloadError: The pseudo-gradient is not finite.
            PrivacyBudgetExhausted: Training would spend past the participant's own
                differential-privacy budget; nothing was trained or sealed.
            OverlapBaseMissing: The attempt trains from a model this participant does not
                hold (``federation.overlap``); nothing was trained or sealed.
        """
        fed = self.config.federation
        self.settle_snapshot()  # the previous round's, before training changes the state
        decode_start = time.perf_counter()
        global_params, _ = verify_model_payload(
            model_payload, opening.model_hash, self.architecture
        )
        deserialize_s = time.perf_counter() - decode_start
        if self.attacker is not None:
            self.attacker.observe(opening.model_version, global_params)
        heldout = self.learner.heldout_loss(global_params)
        here = (opening.round_index, opening.attempt)
        self.overlap.hold(opening, global_params)
        base = self.overlap.base(opening, global_params)
        if self._trained is not None and self._trained >= here:
            # The coordinator restarted and reopened a round this participant already trained:
            # rewind the inner state so the retraining reproduces the same pseudo-gradient.
            self.restore(*here)
        local, compute_s = self._train(opening, base)
        encode_start = time.perf_counter()
        delta = pseudo_gradient(base, local.params)
        self.overlap.keep_own(opening, delta)
        if self.attacker is not None:
            delta = self.attacker.tamper(*here, delta, peers)
            heldout = self.attacker.report(*here, heldout)
        wire = quantize(delta, fed.quantization, fed.int8_chunk)
        metadata = self._metadata(
            opening, local.mean_loss, compute_s, heldout, local.privacy_epsilon
        )
        payload = self.guard.seal(wire, metadata)
        serialize_s = time.perf_counter() - encode_start
        self._trained = here
        self._save_state(opening, snapshot_behind)
        return Contribution(
            payload,
            bytes_hash(payload),
            float(local.mean_loss),
            compute_s,
            serialize_s=serialize_s,
            deserialize_s=deserialize_s,
            heldout_loss=heldout,
            privacy_epsilon=local.privacy_epsilon,
        )
