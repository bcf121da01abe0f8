"""Who takes part, and which updates are read: the session, Join and Leave, the header check.

What the transport decides on its own, before the coordinator sees anything (so a hostile or
broken participant costs at most ``network.max_message_bytes`` of memory and never stalls a
round): the coordinator session (``FAILED_PRECONDITION``, reason ``stale_session``), the config
a participant joins with (refused naming the differing fields), and the round and attempt of an
update (``FAILED_PRECONDITION``, reason ``closed_round``: the coordinator's own rule,
:func:`~lensemble.federation.admission.admit_attempt`, applied to the header before any
payload byte is buffered).
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass
from typing import Any

from lensemble import __version__
from lensemble.config import LensembleConfig, config_hash
from lensemble.config.hashing import differing_paths, hashed_view
from lensemble.federation.messages import Verdict
from lensemble.network.coordinator.attempt_board import AttemptBoard
from lensemble.network.coordinator.liveness import Liveness
from lensemble.network.coordinator.rejection import Rejection
from lensemble.network.shared import transport_errors as nerr
from lensemble.network.shared.logs import event
from lensemble.network.shared.metrics import Metrics
from lensemble.network.shared.peer_text import shown, shown_all

_log = logging.getLogger("lensemble.network.coordinator")


@dataclass(frozen=True)
class JoinOutcome:
    """The coordinator's answer to a Join (see ``JoinReply`` in the proto)."""

    accepted: bool
    message: str
    differing: list[str]
    collecting_round: int
    round_open: bool
    collecting_attempt: int
    already_submitted: bool
    run_over: bool


class Admission:
    """The coordinator session, Join and Leave, and the header check of an update.

    Args:
        config: The run's config.
        board: The transport's shared round state (and its lock).
        liveness: Where joins and departures are counted.
        metrics: Where refusals and joins are counted.

    Attributes:
        session: Random id of this coordinator process, returned by Join and required in every
            later call, so participants notice a restarted coordinator.
        config_hash: The run's config hash, which a participant must join with.
    """

    def __init__(
        self, config: LensembleConfig, board: AttemptBoard, liveness: Liveness, metrics: Metrics
    ) -> None:
        self._config = config
        self._board = board
        self._liveness = liveness
        self._metrics = metrics
        self.session = secrets.token_hex(8)
        self.config_hash = config_hash(config)

    def stale_session(self, session: str) -> Rejection | None:
        """The refusal of a call made with a session other than this coordinator's, else None."""
        if session == self.session:
            return None
        return Rejection(
            nerr.STALE_SESSION,
            "this coordinator restarted since you joined; join again.",
            self._board.collecting_round,
        )

    def join(self, participant_id: str, hash_: str, view_json: str, version: str) -> JoinOutcome:
        """Register a participant whose config hash matches; name the differing fields if not."""
        if hash_ != self.config_hash:
            return self._refuse_join(participant_id, hash_, view_json)
        board = self._board
        with board.cond:
            rejoin = self._liveness.note_joined(participant_id)
            opening = board.opening
            board.cond.notify_all()
            self._metrics.seen(participant_id)
            outcome = JoinOutcome(
                True,
                f"welcome, {participant_id}.",
                [],
                board.collecting_round,
                opening is not None,
                opening.attempt if opening is not None else 0,
                opening is not None and participant_id in board.accepted,
                board.final,
            )
        self._metrics.set_joined(self._liveness.joined_count())
        if version != __version__:
            _log.warning(
                "%s runs Lensemble %s, the coordinator %s; the config hashes match, continuing.",
                participant_id,
                shown(version),
                __version__,
            )
        event(
            _log,
            "joined",
            f"{participant_id} {'re' if rejoin else ''}joined at round {outcome.collecting_round}"
            f"{' (open)' if outcome.round_open else ''}.",
            participant=participant_id,
            rejoin=rejoin,
            round=outcome.collecting_round,
        )
        return outcome

    def _refuse_join(self, participant_id: str, hash_: str, view_json: str) -> JoinOutcome:
        """The refusal of a Join whose config hash differs, naming the differing fields."""
        differing = self._differing(view_json)
        self._metrics.refused_calls.labels(rpc="Join", reason="config_mismatch").inc()
        logged = shown_all(differing)
        event(
            _log,
            "join_refused",
            f"refused {participant_id}: config hash {shown(hash_[:28])}... differs from "
            f"{self.config_hash[:28]}... in {', '.join(logged) or 'unknown fields'}.",
            logging.WARNING,
            participant=participant_id,
            differing=logged,
        )
        return JoinOutcome(
            False,
            f"the config hash {hash_} differs from the coordinator's {self.config_hash}; "
            "differing fields: " + (", ".join(differing) or "(the view could not be read)"),
            differing,
            self._board.collecting_round,
            False,
            0,
            False,
            self._board.final,
        )

    def _differing(self, view_json: str) -> list[str]:
        """Field paths where the participant's hashed config view differs from ours."""
        try:
            theirs = json.loads(view_json)
            if not isinstance(theirs, dict):
                return []
            return differing_paths(theirs, hashed_view(self._config))
        except (ValueError, RecursionError):  # RecursionError: nested beyond Python's depth
            return []

    def leave(self, participant_id: str, reason: str) -> None:
        """Record that a participant left."""
        board = self._board
        with board.cond:
            self._liveness.note_left(participant_id)
            board.cond.notify_all()
        self._metrics.seen(participant_id)
        self._metrics.set_joined(self._liveness.joined_count())
        event(_log, "left", f"{participant_id} left ({shown(reason)}).", participant=participant_id)

    def precheck(self, header: Any) -> Rejection | Verdict | None:
        """Judge an update header before any payload byte is buffered.

        Returns:
            A rejection (``abstained`` for an attempt its sender sits out); an accepted
            ``DUPLICATE`` verdict for a resend of an update already counted in the attempt that
            just closed; or None to read the payload.
        """
        with self._board.cond:
            return self._board.admission(
                header.participant_id, header.round_index, header.attempt, header.payload_hash
            )
