"""Judging submissions: which update counts in the open attempt, and why the others do not.

A submission is rejected, never crashing the coordinator, when it comes from an unknown sender,
targets another round or another attempt of this round (:func:`admit_attempt`, the one rule
every transport applies), does not hash to its declared hash, conflicts with an earlier one,
is corrupt, carries metadata it may not or the wrong round, attempt, wire format or base
model, has another architecture, is out of the int8 scale bounds, or carries NaN/Inf. An
accepted update is kept in the coordinator's spool (:mod:`lensemble.federation.spool`) with its
norm, its cosine with the outer momentum (the suspicion history's direction,
:mod:`lensemble.federation.suspicion`), hash, size and bounded self-reported statistics
(:func:`self_reported`).

:class:`Admission` judges on one thread: transports hand submissions over one at a time.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from lensemble.config.schema import FederationConfig
from lensemble.errors import ArchitectureMismatch, PayloadError, ScaleOutOfRange
from lensemble.federation.attempt import Collection
from lensemble.federation.messages import Reason, RoundOpening, Submission, Verdict
from lensemble.federation.payload import Decoded, TensorSpec, bytes_hash, decode
from lensemble.federation.quantization import dequantize, wire_specs
from lensemble.federation.residency import ALLOWED_METADATA, MAX_METADATA_VALUE
from lensemble.federation.robustness import cosine, update_norm
from lensemble.federation.spool import UpdateSpool
from lensemble.machinery.hash_behind import hashing_thread

_log = logging.getLogger("lensemble.federation.coordinator")

#: Header bytes a pseudo-gradient payload may use: a base plus this much per tensor.
HEADER_BASE_BYTES = 8192
HEADER_BYTES_PER_TENSOR = 1024
#: Self-reported statistics the ledger keeps, with the range each must lie in (inclusive);
#: a value outside it, unparseable or not finite is recorded as null.
SELF_REPORTED_RANGES: dict[str, tuple[float, float]] = {
    "mean_loss": (-1e6, 1e6),
    "compute_s": (0.0, 1e6),
    "heldout_loss": (0.0, 1e6),
}
#: Statistics kept only when a participant reports them (so a run without them records what it
#: always did): ``privacy_epsilon``, the differential-privacy epsilon it says it has spent.
OPTIONAL_REPORTED_RANGES: dict[str, tuple[float, float]] = {
    "privacy_epsilon": (0.0, 1e6),
}
#: Longest rejection detail kept in the ledger (characters).
MAX_DETAIL = 240


def self_reported(metadata: Mapping[str, str]) -> dict[str, float | None]:
    """The statistics a participant reported about itself, bounded by :data:`SELF_REPORTED_RANGES`.

    Those of :data:`OPTIONAL_REPORTED_RANGES` appear only when the metadata has them.

    Args:
        metadata: Payload metadata (strings, at most ``MAX_METADATA_VALUE`` characters each).

    Returns:
        Key -> value, or None when missing, unparseable, not finite or out of range.
    """
    out: dict[str, float | None] = {}
    optional = {k: r for k, r in OPTIONAL_REPORTED_RANGES.items() if k in metadata}
    for key, (low, high) in {**SELF_REPORTED_RANGES, **optional}.items():
        try:
            value = float(metadata.get(key, "nan"))
        except ValueError:
            value = math.nan
        out[key] = value if math.isfinite(value) and low <= value <= high else None
    return out


@dataclass(frozen=True)
class Content:
    """What judging found in an update that holds (:meth:`Admission._content`).

    Attributes:
        decoded: The parsed payload (views of its bytes).
        norm: L2 norm of the dequantized float32 pseudo-gradient.
        cosine: Its cosine with the coordinator's reference direction, None without one.
    """

    decoded: Decoded
    norm: float
    cosine: float | None


@dataclass(frozen=True)
class ClosedAttempt:
    """The round attempt that closed last (committed or aborted) and what it counted.

    Attributes:
        round_index: Its round.
        attempt: Its attempt.
        accepted: Participant id -> ``sha256:<hex>`` payload hash of each update it accepted.
    """

    round_index: int
    attempt: int
    accepted: Mapping[str, str]


def admit_attempt(
    sender: str,
    round_index: int,
    attempt: int,
    payload_hash: str,
    *,
    opening: RoundOpening | None,
    closed: ClosedAttempt | None,
    current_round: int,
) -> Verdict | None:
    """The ``(round, attempt)`` admission rule, judged from a submission's header alone.

    The coordinator applies it to every submission; the network transport applies the same
    function before buffering a payload, so no transport admits what another refuses. An update
    trained for an attempt that is no longer open (an aborted attempt's late update included)
    is never counted in another attempt, even of the same round with the same base model.

    Args:
        sender: The authenticated participant id.
        round_index: Round the submission says it is for.
        attempt: Attempt the submission says it is for.
        payload_hash: ``sha256:<hex>`` the sender declared.
        opening: The attempt being collected, or None between attempts.
        closed: The attempt that closed last, or None.
        current_round: The round the coordinator is collecting (for the verdict).

    Returns:
        None when the submission targets the open attempt (its content is judged next); an
        accepted ``DUPLICATE`` verdict for a resend of an update already counted in the attempt
        that just closed (its reply was lost); otherwise a ``CLOSED_ROUND`` rejection.
    """
    key = (round_index, attempt)
    if opening is not None and key == (opening.round_index, opening.attempt):
        return None
    if (
        closed is not None
        and key == (closed.round_index, closed.attempt)
        and closed.accepted.get(sender) == payload_hash
    ):
        return Verdict(Reason.DUPLICATE, f"already counted in round {round_index}.", current_round)
    state = (
        f"round {opening.round_index} attempt {opening.attempt} is open"
        if opening is not None
        else "no round is open"
    )
    return Verdict(
        Reason.CLOSED_ROUND,
        f"round {round_index} attempt {attempt} is not being collected; {state}.",
        current_round,
    )


def _mismatch_reason(key: str, value: str) -> Reason:
    """Why a metadata field that does not name this attempt is refused.

    Only a well-formed other round or attempt number is a closed one; missing or garbled round
    metadata is a malformed payload (issue 41).
    """
    number = key in ("round", "attempt") and value.isascii() and value.isdigit()
    return Reason.CLOSED_ROUND if number else Reason.BAD_PAYLOAD


class VerdictObserver(Protocol):
    """Hears every verdict (the coordinator's observer)."""

    def on_verdict(self, submission: Submission, verdict: Verdict) -> None:
        """A submission was judged."""
        ...


class Admission:
    """Judges each submission for the open attempt and keeps the accepted ones.

    Args:
        fed: The run's ``federation`` config (participants, wire format, robustness bounds).
        architecture: The global model's tensor specs every update must match.
        spool: Where accepted updates wait until their attempt closes.
        next_round: The round collected next when none is open (the model version).
        observer: Hears every verdict.

    Attributes:
        expected: Every configured participant id.
        max_header_bytes: The largest safetensors header an update may have (bytes).
        rejections: Reason code -> how many submissions were refused for it.
        collection: The open attempt's collection, or None between attempts.
        closed: The attempt that closed last, or None.
        reference: Returns the direction each update's cosine is taken with (the outer
            momentum the open attempt started from); None (the default) records no cosines.
    """

    def __init__(
        self,
        fed: FederationConfig,
        architecture: Mapping[str, TensorSpec],
        spool: UpdateSpool,
        next_round: Callable[[], int],
        observer: VerdictObserver | None = None,
    ) -> None:
        self.fed = fed
        self.architecture = dict(architecture)
        self.expected = frozenset(p.id for p in fed.participants)
        wire = wire_specs(self.architecture, fed.quantization, fed.int8_chunk)
        self.max_header_bytes = HEADER_BASE_BYTES + HEADER_BYTES_PER_TENSOR * len(wire)
        self.spool = spool
        self.next_round = next_round
        self.observer = observer
        self.rejections: Counter[str] = Counter()
        self.collection: Collection | None = None
        self.closed: ClosedAttempt | None = None
        self.reference: Callable[[], Mapping[str, torch.Tensor]] | None = None
        self._reference_norm = 0.0

    @property
    def collecting_round(self) -> int:
        """The round being collected, or the next one when none is open."""
        return self.collection.opening.round_index if self.collection else self.next_round()

    def open(self, opening: RoundOpening) -> Collection:
        """Start collecting ``opening`` (the spool is emptied)."""
        self.collection = Collection(opening, self.expected)
        self.spool.reset()
        self._reference_norm = update_norm(self.reference()) if self.reference else 0.0
        return self.collection

    def close(self) -> Collection:
        """Stop collecting; later resends of what it accepted are answered as duplicates."""
        col = self.collection
        assert col is not None
        self.collection = None
        opening = col.opening
        self.closed = ClosedAttempt(opening.round_index, opening.attempt, dict(col.hashes))
        return col

    def accept(self, submission: Submission) -> Verdict:
        """Validate one submission for the open attempt and keep it if valid.

        Never raises on bad input: every problem becomes a rejection with a reason. Should
        judging itself fail on some input nobody foresaw (a bug), a last-resort guard logs it
        and rejects the submission as ``bad_payload`` instead of letting the coordinator die;
        judging changes no state until the submission is accepted, so nothing is half-done. A
        byte-identical resend of an accepted submission is accepted again without effect.

        Returns:
            The verdict (also counted in ``rejections`` when rejected).
        """
        try:
            verdict = self._judge(submission)
        except Exception as exc:  # the last-resort guard: reject, never die
            _log.error(
                "judging a submission raised %s; rejected as bad_payload (a bug, please report)",
                type(exc).__name__,
                exc_info=True,
            )
            verdict = self._verdict(
                Reason.BAD_PAYLOAD, f"the payload could not be judged ({type(exc).__name__})."
            )
        if not verdict.accepted:
            self._count_rejection(submission, verdict)
        if self.observer is not None:
            self.observer.on_verdict(submission, verdict)
        return verdict

    def _count_rejection(self, submission: Submission, verdict: Verdict) -> None:
        self.rejections[verdict.reason.value] += 1
        col = self.collection
        # Only a rejection of an update for this attempt explains an exclusion from it.
        if col and submission.sender in col.expected and col.targets(submission):
            col.rejected[submission.sender] = verdict.reason.value
            col.details[submission.sender] = verdict.message[:MAX_DETAIL]

    def _verdict(self, reason: Reason, message: str) -> Verdict:
        return Verdict(reason, message, self.collecting_round)

    def _judge(self, sub: Submission) -> Verdict:
        if sub.sender not in self.expected:
            return self._verdict(
                Reason.UNKNOWN_PARTICIPANT, f"'{sub.sender}' is not a participant of this run."
            )
        col = self.collection
        early = admit_attempt(
            sub.sender,
            sub.round_index,
            sub.attempt,
            sub.payload_hash,
            opening=col.opening if col else None,
            closed=self.closed,
            current_round=self.collecting_round,
        )
        if early is not None:
            return early
        assert col is not None  # admit_attempt admits only into the open attempt
        if sub.landed is not None:
            return self._judge_landed(sub, col)
        # The network transport hashed the bytes while they streamed in and compared them.
        digest = sub.payload_hash if sub.hash_checked else bytes_hash(sub.payload)
        verdict = self._check_identity(sub, digest, col)
        if verdict is not None:
            return verdict
        content = self._content(sub, sub.payload, col)
        if isinstance(content, Verdict):
            return content
        return self._keep(sub, sub.payload, digest, content, col)

    def _judge_landed(self, sub: Submission, col: Collection) -> Verdict:
        """Judge a payload that landed in a spool file from a private copy of it.

        The file was on disk while the payload waited, where another process of the
        coordinator's user can rewrite it (``/proc/<pid>/fd``). The payload is copied out of
        it, and the copy is both judged and hashed (on the hashing thread, beside the
        judging), so the verdict is about exactly the bytes whose hash is checked against the
        one they had on receipt; the reduction verifies the file again when it reads it back.
        """
        assert sub.landed is not None
        try:
            private = sub.landed.read_back()
        except OSError as exc:
            return self._tampered(sub, f"cannot be read back ({exc.strerror or exc})")
        hashing = hashing_thread().submit(bytes_hash, private)
        try:
            content = self._content(sub, private, col)
        finally:
            digest = hashing.result()  # it reads the copy: wait before anything drops it
        if sub.hash_checked and digest != sub.payload_hash:
            return self._tampered(sub, "changed after it arrived")
        verdict = self._check_identity(sub, digest, col)
        if verdict is not None:
            return verdict
        if isinstance(content, Verdict):
            return content
        return self._keep(sub, private, digest, content, col)

    def _tampered(self, sub: Submission, what: str) -> Verdict:
        """The rejection of an update received intact whose spool file then ``what``."""
        _log.error(
            "the spool file of %s's update %s: something else writes the coordinator's spool "
            "folder; the update is rejected",
            sub.sender,
            what,
        )
        return self._verdict(
            Reason.HASH_MISMATCH,
            f"the update was received intact, but its spool file on the coordinator {what}.",
        )

    def _check_identity(self, sub: Submission, digest: str, col: Collection) -> Verdict | None:
        """The bytes hash to the declared hash and do not conflict with an accepted update."""
        if digest != sub.payload_hash:
            return self._verdict(
                Reason.HASH_MISMATCH,
                f"payload hashes to {digest[:19]}..., the sender declared "
                f"{sub.payload_hash[:19]}...",
            )
        if sub.sender not in col.hashes:
            return None
        if col.hashes[sub.sender] == digest:
            return self._verdict(Reason.DUPLICATE, "duplicate of an accepted submission.")
        return self._verdict(
            Reason.CONFLICTING_DUPLICATE,
            f"'{sub.sender}' already submitted different bytes for round {sub.round_index}.",
        )

    def _check_metadata(
        self, meta: Mapping[str, str], sub: Submission, col: Collection
    ) -> Verdict | None:
        """Only allowed, short metadata, naming this attempt, sender, wire format and base."""
        for key in sorted(meta):
            if key != "format" and key not in ALLOWED_METADATA:
                return self._verdict(
                    Reason.BAD_PAYLOAD, f"payload metadata '{key[:64]}' is not allowed."
                )
            if len(meta[key]) > MAX_METADATA_VALUE:
                return self._verdict(
                    Reason.BAD_PAYLOAD,
                    f"payload metadata '{key}' is {len(meta[key])} characters long, more than "
                    f"{MAX_METADATA_VALUE}.",
                )
        expected_meta = {
            "kind": "pseudo-gradient",
            "round": str(col.opening.round_index),
            "attempt": str(col.opening.attempt),
            "participant": sub.sender,
            "quantization": self.fed.quantization,
            "int8_chunk": str(self.fed.int8_chunk),
        }
        for key, value in expected_meta.items():
            if meta.get(key) != value:
                return self._verdict(
                    _mismatch_reason(key, meta.get(key, "")),
                    f"payload field '{key}' is {meta.get(key)!r}, expected {value!r}.",
                )
        if meta.get("base_hash") != col.opening.trains_from:
            return self._verdict(
                Reason.STALE_BASE,
                "the pseudo-gradient was computed from another global model; fetch the current "
                "one.",
            )
        return None

    def _cosine(self, delta: Mapping[str, torch.Tensor], norm: float) -> float | None:
        """Cosine of ``delta`` (of L2 norm ``norm``) with the reference, None when either is 0."""
        if self.reference is None:
            return None
        return cosine(delta, norm, self.reference(), self._reference_norm)

    def _content(
        self, sub: Submission, payload: bytes | bytearray | memoryview, col: Collection
    ) -> Content | Verdict:
        """Parse, check the metadata, dequantize and bound-check; the update's norm if it holds.

        Changes no state.
        """
        try:
            # Views of the payload, no copy: judging only reads them.
            decoded = decode(payload, max_header_bytes=self.max_header_bytes, copy=False)
        except PayloadError as exc:
            return self._verdict(Reason.BAD_PAYLOAD, exc.message)
        verdict = self._check_metadata(decoded.metadata, sub, col)
        if verdict is not None:
            return verdict
        fed = self.fed
        try:
            delta = dequantize(
                decoded.tensors,
                self.architecture,
                fed.quantization,
                fed.int8_chunk,
                max_scale=fed.robustness.max_int8_scale,
            )
        except ArchitectureMismatch as exc:
            return self._verdict(Reason.ARCHITECTURE_MISMATCH, str(exc))
        except ScaleOutOfRange as exc:
            return self._verdict(Reason.OUT_OF_BOUNDS, exc.message)
        except PayloadError as exc:
            return self._verdict(Reason.NON_FINITE, exc.message)
        norm = update_norm(delta)
        return Content(decoded, norm, self._cosine(delta, norm))

    def _keep(
        self,
        sub: Submission,
        payload: bytes | bytearray | memoryview,
        digest: str,
        content: Content,
        col: Collection,
    ) -> Verdict:
        """Accept the judged update: spool it, with its norm, cosine, hash and size.

        ``content`` is what :meth:`_content` found.
        """
        decoded = content.decoded
        col.norms[sub.sender] = content.norm
        col.cosines[sub.sender] = content.cosine
        self.spool.add(sub.sender, payload, digest, decoded, sub.landed)
        col.hashes[sub.sender] = digest
        col.sizes[sub.sender] = len(payload)
        col.reported[sub.sender] = self_reported(decoded.metadata)
        col.rejected.pop(sub.sender, None)
        col.details.pop(sub.sender, None)
        return self._verdict(Reason.ACCEPTED, "accepted.")
