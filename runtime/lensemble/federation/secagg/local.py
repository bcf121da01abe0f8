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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from lensemble.federation.secagg import identity
from lensemble.federation.secagg.context import SessionContext
from lensemble.federation.secagg.driver import ANSWERED, SENT, STAGES, Party, drive
from lensemble.federation.secagg.errors import SecAggRefusal
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


#: A participant takes part in stage i of :data:`~.driver.STAGES` while i <= its last.
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
    """The in-process wire: each stage's messages to the active participants, in a seeded order."""

    def __init__(
        self,
        parties: dict[str, Party],
        drop: Mapping[str, DropAfter],
        rng: random.Random,
        *,
        tamper: Tamper | None,
        forge: Tamper | None,
    ) -> None:
        self.parties = parties
        self.drop = drop
        self.rng = rng
        self.tamper = tamper
        self.forge = forge
        self.traffic = Traffic()
        self.refusals: dict[str, SecAggRefusal] = {}
        self.exchange_s = 0.0

    def active(self, stage: str) -> list[str]:
        """Participants still there for ``stage``, in this stage's arrival order."""
        index = STAGES.index(stage)
        names = [
            p
            for p in sorted(self.parties)
            if p not in self.refusals and _LAST[self.drop.get(p, DropAfter.NEVER)] >= index
        ]
        self.rng.shuffle(names)
        return names

    def exchange(self, stage: str, outgoing: Mapping[str, bytes]) -> Iterator[tuple[str, bytes]]:
        """One round trip: each active addressed participant gets its message and answers.

        Lazily, one answer at a time, as a network coordinator receives them: the session adds
        each masked vector to its sum before the next participant masks, so one session never
        holds all n vectors. The participants' time (not the coordinator's) is
        :attr:`exchange_s`.
        """
        for name in self.active(stage):
            if name not in outgoing:
                continue
            start = time.perf_counter()
            data = outgoing[name]
            if stage in SENT:
                if self.tamper is not None:
                    data = self.tamper(stage, name, data)
                self.traffic.bytes[SENT[stage].__name__].append(len(data))
            answer = self._answer(name, stage, data)
            if answer is not None and self.forge is not None:
                answer = self.forge(stage, name, answer)
            self.exchange_s += time.perf_counter() - start
            if answer is None:
                continue
            self.traffic.bytes[ANSWERED[stage].__name__].append(len(answer))
            yield name, answer
            del answer

    def _answer(self, name: str, stage: str, data: bytes) -> bytes | None:
        start = time.perf_counter()
        try:
            return self.parties[name].answer(stage, data)
        except SecAggRefusal as refusal:
            self.refusals[name] = refusal
            return None
        finally:
            self.traffic.client_s[name] += time.perf_counter() - start


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
    get = updates if callable(updates) else updates.__getitem__
    parties = {
        p: Party(
            ParticipantSession(context, p, seeds[p], identity_keys[p], verifiers),
            functools.partial(get, p),
        )
        for p in context.roster
        if drop.get(p) is not DropAfter.START
    }
    run = _Run(parties, drop, random.Random(order_seed), tamper=tamper, forge=forge)
    server = ServerSession(context, verifiers)
    start = time.perf_counter()
    try:
        result = drive(server, run.exchange)
    finally:
        # The coordinator's time: the whole session but the participants' part of it.
        run.traffic.server_s = time.perf_counter() - start - run.exchange_s
    return LocalResult(result, run.refusals, run.traffic)
