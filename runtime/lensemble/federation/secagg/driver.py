"""The two sides of one session over any transport: five round trips of encoded messages.

:func:`drive` is the coordinator's side: it sends each stage's messages through an
:data:`Exchange` (whatever carries bytes to the participants and their answers back by the
stage's deadline), hands every answer to its :class:`~.server.ServerSession`, and returns the
:class:`~.server.SecureSum`. :class:`Party` is a participant's side: it answers each stage's
message with its :class:`~.participant.ParticipantSession`. Neither knows the transport, so the
in-process simulation (:mod:`~.local`) and the network run the same steps on the same bytes.

An answer counts for the participant the transport authenticated, never for the id the message
claims: one whose claimed sender differs is refused (``unknown_participant``), so a participant
cannot speak for another even before the signatures are checked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import numpy as np

from lensemble.federation.secagg.errors import Reason, SecAggAbort, SecAggRefusal
from lensemble.federation.secagg.messages import (
    ConsistencySignature,
    EncryptedShares,
    KeyAdvert,
    KeyRoster,
    MaskedInput,
    ShareDelivery,
    SurvivorSet,
    UnmaskRequest,
    UnmaskShares,
)
from lensemble.federation.secagg.participant import ParticipantSession
from lensemble.federation.secagg.present import PresentSet
from lensemble.federation.secagg.server import SecureSum, ServerSession

K = TypeVar("K")
#: One answer: the participant the transport authenticated, and its bytes.
Answer = tuple[str, bytes | memoryview]

#: The protocol's stages, in order (Bonawitz et al., CCS'17, rounds 0-4 of Figure 4).
STAGES = ("advertise", "share", "mask", "consistency", "unmask")
#: What each stage sends to the participants and gets back. ``advertise`` sends nothing, or the
#: attempt's :class:`~.present.PresentSet` where the groups were drawn from one (read by
#: :class:`~lensemble.federation.masking_client.MaskingClient`, before a :class:`Party` exists).
SENT: dict[str, type[Any]] = {
    "share": KeyRoster,
    "mask": ShareDelivery,
    "consistency": SurvivorSet,
    "unmask": UnmaskRequest,
}
ANSWERED: dict[str, type[Any]] = {
    "advertise": KeyAdvert,
    "share": EncryptedShares,
    "mask": MaskedInput,
    "consistency": ConsistencySignature,
    "unmask": UnmaskShares,
}

#: ``exchange(stage, {participant: message bytes})`` -> ``(participant, answer bytes)`` pairs
#: as they arrive, until every addressed participant answered or the stage's deadline passed;
#: the participant is the one the transport authenticated. Who does not answer has dropped out.
#: An answer may be a read-only view (of the spool file a masked vector landed in); the
#: session keeps nothing of it once handed over, so produce answers lazily: a masked vector is
#: added to the running sum and dropped before the next one is asked for.
Exchange = Callable[[str, Mapping[str, bytes]], Iterable[tuple[str, bytes | memoryview]]]
#: :data:`Exchange` for several sessions at once: each addressed participant's message comes
#: with the session it belongs to (``{participant: (session, message bytes)}``); one deadline
#: covers the stage of every session.
SessionsExchange = Callable[
    [str, Mapping[str, tuple[K, bytes]]], Iterable[tuple[str, bytes | memoryview]]
]


def drive(server: ServerSession, exchange: Exchange) -> SecureSum:
    """Run the coordinator's side of ``server``'s session to its end.

    Args:
        server: A fresh session (nothing received yet).
        exchange: Carries each stage's messages and brings the answers back.

    Returns:
        The sum of the survivors' encoded updates, with the sets of every stage.

    Raises:
        SecAggAbort: A stage closed with too few participants, or no shares reconstruct a
            secret; the round cannot use this session.
    """

    def one(stage: str, outgoing: Mapping[str, tuple[None, bytes]]) -> Iterable[Answer]:
        return exchange(stage, {p: data for p, (_, data) in outgoing.items()})

    outcome = drive_together({None: server}, one)[None]
    if isinstance(outcome, SecAggAbort):
        raise outcome
    return outcome


def drive_together(
    servers: Mapping[K, ServerSession], exchange: SessionsExchange[K], quorum: int = 0
) -> dict[K, SecureSum | SecAggAbort]:
    """Run several sessions (one per group) stage by stage in lock-step, to their ends.

    Each stage of every session still running goes out in one :data:`SessionsExchange` call,
    so the participants of all groups answer under one deadline: silent members in k groups
    cost one stage deadline, not k. Sessions share nothing: each answer goes to its sender's
    session (a participant is in one session at a time), and a session that aborts is left out
    of the later stages while the others go on. Each session's sum depends on its own answers
    only, whatever the order they arrive in.

    When the masked uploads close with fewer than ``quorum`` survivors in all sessions, every
    session is abandoned (``below_quorum``) before anyone is asked to sign a survivor set: the
    attempt cannot commit, and a participant that signed nothing may mask again in its retry.

    Memory: every running session holds its d-word sum (8 d bytes each) until the last stage.

    Args:
        servers: Fresh sessions (nothing received yet) by any key; their rosters are disjoint.
        exchange: Carries each stage's messages of every session and brings the answers back.
        quorum: The fewest survivors the sessions' sums must hold in all (0: no gate).

    Returns:
        Each key's outcome: its sum (:class:`~.server.SecureSum`), or the
        :class:`~.errors.SecAggAbort` that ended it.
    """
    outcomes: dict[K, SecureSum | SecAggAbort] = {}
    outgoing: dict[K, dict[str, bytes]] = {}
    for key, server in servers.items():
        present = server.context.present
        # advertise carries the attempt's present set when the groups were drawn from one.
        start = PresentSet(present).encode() if present else b""
        outgoing[key] = dict.fromkeys(server.context.roster, start)
    for stage in STAGES:
        running = [key for key in servers if key not in outcomes]
        addressed = {p: (key, data) for key in running for p, data in outgoing[key].items()}
        for sender, data in exchange(stage, addressed):
            if sender in addressed:  # the transport brings only addressed senders
                server = servers[addressed[sender][0]]
                _hand_over(server, stage, sender, data, getattr(server, _RECEIVE[stage]))
            del data
        for key in running:
            try:
                outgoing[key] = _close(servers[key], stage)
                if stage == STAGES[-1]:
                    outcomes[key] = servers[key].finish()
            except SecAggAbort as abort:
                outcomes[key] = abort
        if stage == "mask":
            _gate(servers, outgoing, outcomes, quorum)
    return {key: outcomes[key] for key in servers}


def _gate(
    servers: Mapping[K, ServerSession],
    survivors: Mapping[K, Mapping[str, bytes]],
    outcomes: dict[K, SecureSum | SecAggAbort],
    quorum: int,
) -> None:
    """Abandon every running session when their survivors (U3) are fewer than ``quorum``."""
    running = [key for key in servers if key not in outcomes]
    total = sum(len(survivors[key]) for key in running)
    if total >= quorum:
        return
    for key in running:
        outcomes[key] = servers[key].abandon(
            f"{total} masked inputs in all groups, fewer than the quorum of {quorum}; no one "
            "is asked to sign the survivor set."
        )


#: The session's method that takes each stage's answers.
_RECEIVE = {
    "advertise": "receive_advert",
    "share": "receive_shares",
    "mask": "receive_masked",
    "consistency": "receive_consistency",
    "unmask": "receive_unmask",
}


def _close(server: ServerSession, stage: str) -> dict[str, bytes]:
    """Close ``stage`` of ``server``'s session: the next stage's message to each participant.

    Raises:
        SecAggAbort: The stage closed with too few participants.
    """
    if stage == "advertise":
        roster = server.close_advertising()
        sent = roster.encode()
        return {advert.sender: sent for advert in roster.adverts}
    if stage == "share":
        return {p: delivery.encode() for p, delivery in server.close_sharing().items()}
    if stage == "mask":
        survivors = server.close_masking()
        return dict.fromkeys(survivors.survivors, survivors.encode())
    if stage == "consistency":
        request = server.close_consistency()
        sent = request.encode()
        return {signer: sent for signer, _ in request.signatures}
    return {}  # unmask: the session finishes


def _hand_over(
    server: ServerSession,
    stage: str,
    sender: str,
    data: bytes | memoryview,
    receive: Callable[[Any], None],
) -> None:
    """Decode one answer and hand it to the session; its refusal is kept, never raised."""
    kind = ANSWERED[stage]
    try:
        message = kind.decode(data)
        if message.sender != sender:
            raise SecAggRefusal(
                Reason.UNKNOWN_PARTICIPANT,
                f"{sender} sent a message that claims to be {message.sender}'s.",
                stage=stage,
                participant=sender,
                remediation="The sender is treated as dropped from this session.",
            )
        receive(message)
    except SecAggRefusal as refusal:
        # Kept for the ledger: without its frames, which would keep the answer's bytes alive.
        refusal.__traceback__ = None
        if refusal.participant is None:  # a parser's refusal names no one: the sender
            refusal.participant = sender
        if refusal not in server.refusals:  # a parser's or the driver's, not the session's
            server.refusals.append(refusal)


class Party:
    """A participant's side of one session: each stage's message in, its answer out.

    Args:
        session: The participant's session (fresh).
        update: Gives the participant's float update (d values, any float dtype) when it
            masks; called once, so the update need exist only from then on.
    """

    def __init__(self, session: ParticipantSession, update: Callable[[], np.ndarray]) -> None:
        self.session = session
        self._update = update

    def answer(self, stage: str, data: bytes) -> bytes:
        """The encoded answer to ``stage``'s message ``data``.

        Raises:
            SecAggRefusal: The message is malformed, out of order or fails a check; the
                session answers nothing more.
            KeyError: ``stage`` is not one of :data:`STAGES`.
        """
        session = self.session
        if stage == "advertise":
            return session.advertise().encode()
        if stage == "share":
            return session.share_keys(KeyRoster.decode(data)).encode()
        if stage == "mask":
            return session.mask(ShareDelivery.decode(data), self._update()).encode()
        if stage == "consistency":
            return session.check_consistency(SurvivorSet.decode(data)).encode()
        if stage == "unmask":
            return session.unmask(UnmaskRequest.decode(data)).encode()
        raise KeyError(f"{stage!r} is not a secure-aggregation stage")
