"""The next round's inner steps, run while this round's update travels (``federation.overlap``).

Under ``federation.overlap.mode: one_round`` a participant can train round t + 1 as soon as it
has sealed its update of round t (:meth:`Participant.train_ahead`): the upload, the
coordinator's aggregation and the new model's download then overlap the inner steps instead of
following them. :class:`TrainAhead` runs that training on a thread of its own and lets the
participant loop wait for it before anything else touches the participant (the next
contribution, rewinding a refused update, lining up after a rejoin): the participant's learner
and inner state have one user at a time.
"""

from __future__ import annotations

import threading

from lensemble.federation.messages import RoundOpening
from lensemble.federation.participant import Participant


class TrainAhead:
    """At most one :meth:`Participant.train_ahead` in flight, on a daemon thread.

    Args:
        participant: The participant whose next round is trained.
        enabled: False turns it off (overlap off; or a ``rank_kill`` fault, which is armed
            only once the round is announced).
    """

    def __init__(self, participant: Participant, enabled: bool) -> None:
        self.participant = participant
        self.enabled = enabled
        self._thread: threading.Thread | None = None

    def start(self, sent: RoundOpening) -> None:
        """Train the round after ``sent`` on a thread (after waiting for one in flight)."""
        if not (self.enabled and self.participant.overlap.enabled):
            return
        self.settle()
        self._thread = threading.Thread(
            target=self.participant.train_ahead,
            args=(sent,),
            name=f"{self.participant.id}-ahead",
            daemon=True,
        )
        self._thread.start()

    def settle(self) -> None:
        """Wait until the training in flight, if any, has finished."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
