"""The one Transport seam the coordinator drives (in-process simulation or gRPC).

The coordinator is single-threaded and talks to its transport only through
:class:`CoordinatorTransport`: every call it makes is declared here, and nothing else of a
transport is ever reached. A transport delivers the round opening and the model payload to
participants, hands back their submissions one at a time, and relays the coordinator's verdicts.
Participants never see the transport either: a transport driver calls
:meth:`lensemble.federation.participant.Participant.contribute` with each opening.

Transports subclass :class:`CoordinatorTransport`. The five calls that carry a round must be
implemented; the hooks after them have defaults that do nothing, so a transport overrides only
those it has a use for (as torchft's ``Manager`` keeps its transport to a few calls).

Time is the transport's: the in-process transport runs a virtual clock (deterministic, instant
timeouts), the network transport uses the monotonic clock.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from lensemble.federation.intake import Intake
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.masking import SessionKey
from lensemble.federation.messages import RoundOpening, Submission, Verdict
from lensemble.federation.secagg.identity import VerifyingKey


@dataclass(frozen=True)
class Traffic:
    """Bytes the transport moved for one round attempt.

    Attributes:
        bytes_down: Model payload bytes delivered to participants.
        bytes_up: Submission payload bytes received (accepted or not).
        compute_s: Participants' inner-step time on the round's critical path (seconds), as
            far as the transport can tell (0 when unknown).
    """

    bytes_down: int = 0
    bytes_up: int = 0
    compute_s: float = 0.0


@runtime_checkable
class CoordinatorTransport(Protocol):
    """Everything the coordinator calls on a transport, in the order a run calls it.

    Required: :meth:`now`, :meth:`wait_for_participants`, :meth:`open_round`, :meth:`receive`,
    :meth:`reply`. Hooks with a default that does nothing: :meth:`attach`,
    :meth:`absence_reasons`, :meth:`round_closed`, :meth:`round_durable`, :meth:`take_traffic`,
    :meth:`finish`, and the masked rounds' (:meth:`masking_identities`, :meth:`exchange`,
    :meth:`masking_present`, :meth:`masked_reports`).
    """

    def now(self) -> float:
        """Current time on the transport's clock (seconds)."""
        ...

    def wait_for_participants(self, quorum: int, timeout_s: float) -> set[str]:
        """Block until every configured participant has joined, or ``timeout_s`` passed.

        Returns:
            The ids that have joined (the caller checks quorum).
        """
        ...

    def open_round(self, opening: RoundOpening, model_payload: bytes) -> None:
        """Announce a round and make its model payload available to participants."""
        ...

    def receive(self, until_s: float) -> Submission | None:
        """The next submission arriving before ``until_s`` (transport clock), else None.

        Submissions larger than ``network.max_message_bytes`` never get here.
        """
        ...

    def reply(self, submission: Submission, verdict: Verdict) -> None:
        """Deliver the coordinator's verdict on ``submission`` to its sender."""
        ...

    # ---------------------------------------------------------------- hooks (default: nothing)
    def attach(self, intake: Intake) -> None:
        """Before the first round: the door the transport's receiving threads may use.

        A transport that receives payloads on threads of its own lands them through
        ``intake`` (:mod:`lensemble.federation.intake`); the default ignores it.
        """
        return None

    def absence_reasons(self) -> Mapping[str, str]:
        """Why participants missing from the attempt that is closing are missing.

        Called once per attempt, when collection ends. Participant id -> the ledger's reason
        (``disconnected``, ``left``, ``rank_failure``, ...), recorded instead of ``timeout``.
        The default knows of none.
        """
        return {}

    def round_closed(self, record: RoundRecord) -> None:
        """The round attempt is over (committed or aborted): stop collecting for it."""
        return None

    def round_durable(self, record: RoundRecord) -> None:
        """``record``'s ledger line (and checkpoint) is durable.

        Under write-behind commits this is called on the coordinator's commit thread.
        """
        return None

    def take_traffic(self) -> Traffic:
        """Traffic since the last call (the coordinator calls it once per attempt)."""
        return Traffic()

    # Masked rounds (federation.aggregation: masking, lensemble.federation.masked_round): the
    # coordinator opens the attempt as usual, then runs each group's session through these.
    def masking_identities(self) -> Mapping[str, VerifyingKey]:
        """Every participant's identity public key, as the transport authenticates it.

        The default knows none: every session of a transport without masking aborts.
        """
        return {}

    def exchange(
        self, stage: str, outgoing: Mapping[str, tuple[SessionKey, bytes]]
    ) -> Iterable[tuple[str, bytes | memoryview]]:
        """Send ``stage``'s message of each participant's session to it; yield their answers.

        Every group's session of the attempt runs this stage at once, under one deadline.

        Args:
            stage: One of ``lensemble.federation.secagg.driver.STAGES``.
            outgoing: Participant id -> its session (round, attempt, group) and the message
                bytes for it.

        Returns:
            ``(participant, answer bytes)`` pairs as they arrive, by the stage's deadline; the
            participant is the one the transport authenticated. The default brings none.
        """
        return ()

    def masking_present(self) -> Collection[str] | None:
        """Who is present for the open attempt's sessions, as the transport knows it now.

        Called once per masked attempt, before its sessions start; with several groups they
        are drawn from these participants (:func:`lensemble.federation.masked_round.
        present_now`). The default knows nothing more than :meth:`absence_reasons`: None.
        """
        return None

    def masked_reports(self) -> Mapping[str, Mapping[str, str]]:
        """What each participant reported with its masked upload, for the sessions just ended.

        Participant id -> its statistics (``mean_loss``, ``heldout_loss``, as the metadata of
        a plain upload carries them); the default has none.
        """
        return {}

    def finish(self) -> None:
        """The run is over: tell participants to leave."""
        return None
