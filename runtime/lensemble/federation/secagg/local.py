"""A whole secure-aggregation session in one process: every message encoded, sent, decoded.

:func:`run_session` plays the coordinator and every participant, passing each message through
its byte encoding (so every parser runs and every size is measured), in a seeded arrival order,
with participants dropping out after any stage and an optional hook that alters what the
coordinator sends (a malicious coordinator, for tests). A participant that refuses a message
stops, as a dropped one does. Tests, the bench (``bench/secagg.py``) and, in phase 2, the
in-process transport use it; over the network each party runs its own session object instead.
"""

from __future__ import annotations

import functools
import random
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from lensemble.federation.secagg import identity
from lensemble.federation.secagg.context import SessionContext
from lensemble.federation.secagg.errors import SecAggRefusal
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
from lensemble.federation.secagg.server import SecureSum, ServerSession


class DropAfter(StrEnum):
    """The last stage a participant completes before it drops out."""

    NEVER = "never"
    START = "start"
    ADVERTISE = "advertise"
    SHARE = "share"
    MASK = "mask"
    CONSISTENCY = "consistency"


#: The protocol's stages in order; a participant takes part in stage i while i <= its last.
_STAGES = ("advertise", "share", "mask", "consistency", "unmask")
_LAST = {
    DropAfter.START: -1,
    DropAfter.ADVERTISE: 0,
    DropAfter.SHARE: 1,
    DropAfter.MASK: 2,
    DropAfter.CONSISTENCY: 3,
    DropAfter.NEVER: 4,
}

#: ``hook(stage, participant, message bytes) -> message bytes``: alters a message in transit.
Tamper = Callable[[str, str, bytes], bytes]


@dataclass
class Traffic:
    """What a session cost.

    Attributes:
        bytes: Encoded sizes of every message sent, by message kind (bytes).
        client_s: Seconds each participant spent in its session's steps.
        server_s: Seconds the coordinator spent in its session's steps.
    """

    bytes: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    client_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    server_s: float = 0.0


@dataclass(frozen=True)
class LocalResult:
    """A finished in-process session.

    Attributes:
        sum: The coordinator's result.
        refusals: Every participant's refusal, by participant.
        traffic: Sizes and compute time.
    """

    sum: SecureSum
    refusals: dict[str, SecAggRefusal]
    traffic: Traffic


class _Run:
    def __init__(
        self,
        server: ServerSession,
        parties: dict[str, ParticipantSession],
        drop: Mapping[str, DropAfter],
        rng: random.Random,
        *,
        tamper: Tamper | None,
        forge: Tamper | None,
    ) -> None:
        self.server = server
        self.parties = parties
        self.drop = drop
        self.rng = rng
        self.tamper = tamper
        self.forge = forge
        self.traffic = Traffic()
        self.refusals: dict[str, SecAggRefusal] = {}

    def active(self, stage: str) -> list[str]:
        """Participants still there for ``stage``, in this stage's arrival order."""
        index = _STAGES.index(stage)
        names = [
            p
            for p in sorted(self.parties)
            if p not in self.refusals and _LAST[self.drop.get(p, DropAfter.NEVER)] >= index
        ]
        self.rng.shuffle(names)
        return names

    def client(self, name: str, step: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        try:
            return step()
        except SecAggRefusal as refusal:
            self.refusals[name] = refusal
            return None
        finally:
            self.traffic.client_s[name] += time.perf_counter() - start

    def upload(
        self,
        stage: str,
        message: Any,
        decode: Callable[[bytes], Any],
        receive: Callable[[Any], None],
    ) -> None:
        data = message.encode()
        if self.forge is not None:
            data = self.forge(stage, message.sender, data)
        self.traffic.bytes[type(message).__name__].append(len(data))
        start = time.perf_counter()
        try:
            receive(decode(data))
        except SecAggRefusal as refusal:  # the sender counts as dropped
            if refusal not in self.server.refusals:  # a parser's refusal, not the session's
                self.server.refusals.append(refusal)
        finally:
            self.traffic.server_s += time.perf_counter() - start

    def download(self, stage: str, recipient: str, message: Any) -> Any:
        data = message.encode()
        if self.tamper is not None:
            data = self.tamper(stage, recipient, data)
        self.traffic.bytes[type(message).__name__].append(len(data))
        return type(message).decode(data)

    def server_step(self, step: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        try:
            return step()
        finally:
            self.traffic.server_s += time.perf_counter() - start

    def stage(
        self,
        stage: str,
        broadcast: Callable[[str], Any],
        act: Callable[[ParticipantSession, Any], Any],
        decode: Callable[[bytes], Any],
        receive: Callable[[Any], None],
    ) -> None:
        """One round trip: each active participant gets its message, answers, is received."""
        for name in self.active(stage):
            incoming = broadcast(name)
            if incoming is None:
                continue
            message = self.download(stage, name, incoming)
            party = self.parties[name]
            answer = self.client(name, functools.partial(act, party, message))
            if answer is not None:
                self.upload(stage, answer, decode, receive)


def run_session(
    context: SessionContext,
    updates: Callable[[str], np.ndarray] | Mapping[str, np.ndarray],
    seeds: Mapping[str, bytes],
    identity_keys: Mapping[str, identity.SigningKey],
    *,
    drop: Mapping[str, DropAfter] | None = None,
    order_seed: int = 0,
    tamper: Tamper | None = None,
    forge: Tamper | None = None,
) -> LocalResult:
    """Run one session to its end, in one process.

    Args:
        context: The session's public parameters.
        updates: Each participant's float update (d values), or a function giving it (called
            once, when that participant masks, so only one update need exist at a time).
        seeds: Each participant's 32-byte seed.
        identity_keys: Each participant's identity private key.
        drop: After which stage each participant drops out (default: none do).
        order_seed: Seeds the arrival order of every stage.
        tamper: Alters what the coordinator sends (tests of a malicious coordinator).
        forge: Alters what participants send (tests of malicious participants).

    Returns:
        The coordinator's sum, the participants' refusals, and the traffic.

    Raises:
        SecAggAbort: The coordinator's session aborted.
    """
    drop = drop or {}
    verifiers = {p: key.public_key() for p, key in identity_keys.items()}
    parties = {
        p: ParticipantSession(context, p, seeds[p], identity_keys[p], verifiers)
        for p in context.roster
        if drop.get(p) is not DropAfter.START
    }
    server = ServerSession(context, verifiers)
    run = _Run(server, parties, drop, random.Random(order_seed), tamper=tamper, forge=forge)
    get = updates if callable(updates) else updates.__getitem__
    for name in run.active("advertise"):
        advert = run.client(name, parties[name].advertise)
        if advert is not None:
            run.upload("advertise", advert, KeyAdvert.decode, server.receive_advert)
    roster: KeyRoster = run.server_step(server.close_advertising)
    u1 = {a.sender for a in roster.adverts}
    run.stage(
        "share",
        lambda name: roster if name in u1 else None,
        lambda p, m: p.share_keys(m),
        EncryptedShares.decode,
        server.receive_shares,
    )
    deliveries: dict[str, ShareDelivery] = run.server_step(server.close_sharing)
    run.stage(
        "mask",
        deliveries.get,
        lambda p, m: p.mask(m, get(p.me)),
        MaskedInput.decode,
        server.receive_masked,
    )
    survivors: SurvivorSet = run.server_step(server.close_masking)
    run.stage(
        "consistency",
        lambda name: survivors if name in survivors.survivors else None,
        lambda p, m: p.check_consistency(m),
        ConsistencySignature.decode,
        server.receive_consistency,
    )
    request: UnmaskRequest = run.server_step(server.close_consistency)
    u4 = {signer for signer, _ in request.signatures}
    run.stage(
        "unmask",
        lambda name: request if name in u4 else None,
        lambda p, m: p.unmask(m),
        UnmaskShares.decode,
        server.receive_unmask,
    )
    result = run.server_step(server.finish)
    return LocalResult(result, run.refusals, run.traffic)
