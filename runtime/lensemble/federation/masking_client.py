"""A participant's side of masked rounds: it holds its update and answers each session's stages.

The participant trains as in a plain round, then keeps its update to itself: the coordinator
gets only the masked vector (:mod:`lensemble.federation.secagg`). For every session it is asked
into, the client derives the session's public parameters itself
(:mod:`lensemble.federation.masking`) and answers through a
:class:`~lensemble.federation.secagg.driver.Party`; a message for a session it is not in, for an
attempt it did not train, or that its session refuses, gets no answer (the coordinator counts it
as dropped). Only the open attempt's sessions are kept.

With several groups the ``advertise`` message carries the attempt's present set
(:mod:`lensemble.federation.secagg.present`): the client checks it before it derives the
contexts from it. It takes part in one session per attempt at most: a second ``advertise`` of
the same attempt (another group, or the same group under another present set) gets no answer,
so its update never enters two sums the coordinator could unmask. Nor across attempts: once it
has signed a survivor set in a round (so its masked input may be unmasked in that session), it
takes part in no later attempt of the round, nor in any earlier round index the coordinator
goes back to (``round_already_signed``; the record outlives the process:
:mod:`lensemble.federation.signed_rounds`). A retry sends the same update (its participant's
training of the round, from the same model), and two sums of it with other partners would
expose it (docs/security.md, *one sum per update*). Under central privacy
the noise share is drawn once the present set is known (its groups set the share's size).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from lensemble.config.schema import LensembleConfig
from lensemble.federation.central_privacy import noisy_share
from lensemble.federation.masking import (
    SessionKey,
    least_present,
    regroups,
    session_contexts,
)
from lensemble.federation.payload import TensorSpec
from lensemble.federation.secagg import identity
from lensemble.federation.secagg.driver import Party
from lensemble.federation.secagg.errors import Reason, SecAggRefusal
from lensemble.federation.secagg.participant import ParticipantSession
from lensemble.federation.secagg.present import PresentSet, check_present
from lensemble.federation.signed_rounds import SignedRounds

__all__ = ["MaskingClient", "SignedRounds"]


class MaskingClient:
    """One participant's secure-aggregation sessions.

    Args:
        config: The run's config (its masking fields, participants and seed).
        participant: This participant's id.
        seed: 32 secret bytes every session secret derives from (with the session digest).
        identity_key: The participant's identity private key.
        verifiers: Every participant's identity public key.
        architecture: The global model's tensor specs (d and the vector layout).
        signed: What this participant signed in earlier attempts (shared by its clients);
            a fresh record when None.
    """

    def __init__(
        self,
        config: LensembleConfig,
        participant: str,
        *,
        seed: bytes,
        identity_key: identity.SigningKey,
        verifiers: Mapping[str, identity.VerifyingKey],
        architecture: Mapping[str, TensorSpec],
        signed: SignedRounds | None = None,
    ) -> None:
        self.config = config
        self.me = participant
        self._seed = seed
        self.identity_key = identity_key
        self._verifiers = dict(verifiers)
        self._architecture = dict(architecture)
        self._update: tuple[int, int, np.ndarray] | None = None
        self._parties: dict[SessionKey, Party] = {}
        self.signed = signed if signed is not None else SignedRounds()
        #: Every refusal of this participant's sessions, in order (for the run's log and tests).
        self.refusals: list[SecAggRefusal] = []

    def hold(self, round_index: int, attempt: int, update: np.ndarray) -> None:
        """Keep ``update`` (d float values) for the attempt's session; earlier ones go.

        Under ``federation.central_privacy`` the update is clipped and gets this participant's
        share of the noise when it masks, drawn from its own secret (the sum carries the whole
        noise; its size depends on the attempt's groups).
        """
        self._update = (round_index, attempt, update)
        self._parties = {
            k: p
            for k, p in self._parties.items()
            if (k.round_index, k.attempt) == (round_index, attempt)
        }

    def holds(self, round_index: int, attempt: int) -> bool:
        """Whether an update for ``(round_index, attempt)`` is held (it trained that attempt)."""
        return self._update is not None and self._update[:2] == (round_index, attempt)

    def forget(self) -> None:
        """Drop the held update and every session (the attempt is over)."""
        self._update = None
        self._parties = {}

    def answer(self, key: SessionKey, stage: str, data: bytes) -> bytes | None:
        """The encoded answer to ``stage``'s message of session ``key``, or None (no answer)."""
        try:
            party = self._party(key, data) if stage == "advertise" else self._parties.get(key)
            if party is None:
                return None
            answer = party.answer(stage, data)
            if stage == "consistency":
                self.signed.record(key)  # before the signature leaves: it may be unmasked
            return answer
        except SecAggRefusal as refusal:
            self.refusals.append(refusal)
            return None

    def _party(self, key: SessionKey, announced: bytes) -> Party | None:
        """A fresh party for ``key`` when this participant trained that attempt and is in it.

        Raises:
            SecAggRefusal: ``round_already_signed``: it signed a survivor set in an earlier
                attempt of the round or in a later round. ``present_set_refused`` (or
                ``bad_message``): the announced present set fails a check
                (:func:`~lensemble.federation.secagg.present.check_present`).
        """
        if self._update is None or self._update[:2] != (key.round_index, key.attempt):
            return None
        if any((k.round_index, k.attempt) == (key.round_index, key.attempt) for k in self._parties):
            return None  # one session per attempt: the first stands, its update in one sum only
        signed = self.signed.at_or_after(key.round_index)
        if signed is not None:
            what = (
                f"masking the same update again in attempt {key.attempt} would put it in a "
                "second sum"
                if signed.round_index == key.round_index
                else f"round {key.round_index} is not after it, and masking a retraining of an "
                "earlier round would put an update close to one already summed in a second sum"
            )
            raise SecAggRefusal(
                Reason.ROUND_ALREADY_SIGNED,
                f"{self.me} signed the survivor set of round {signed.round_index} attempt "
                f"{signed.attempt}; {what}.",
                stage="advertise",
                remediation="The participant answers nothing in this attempt; the round needs "
                f"the others, or a round after the one it signed (recorded in "
                f"{self.signed.where()}; a new run needs a new run.output_dir).",
            )
        present = self._present(announced)
        contexts = session_contexts(
            self.config, key.round_index, key.attempt, self._architecture, present
        )
        if not 0 <= key.group < len(contexts) or self.me not in contexts[key.group]:
            return None
        round_index, attempt, update = self._update
        if self.config.federation.central_privacy is not None:
            update = noisy_share(
                update, self.config, self._seed, round_index, attempt, present=present
            )
        session = ParticipantSession(
            contexts[key.group], self.me, self._seed, self.identity_key, self._verifiers
        )
        party = Party(session, lambda: update)
        self._parties[key] = party
        return party

    def _present(self, announced: bytes) -> tuple[str, ...] | None:
        """The announced present set once checked; None (every participant) when none came.

        Raises:
            SecAggRefusal: The announcement is malformed, or fails a check.
        """
        if not announced:
            return None
        members = PresentSet.decode(announced).members
        if not regroups(self.config):
            raise SecAggRefusal(
                Reason.PRESENT_SET_REFUSED,
                "a present set was announced, but this run has one group: its roster is every "
                "configured participant.",
                stage="advertise",
                remediation="The participant answers nothing in this attempt.",
            )
        check_present(
            members,
            configured=self.config.participant_ids,
            me=self.me,
            least=least_present(self.config),
        )
        return members
