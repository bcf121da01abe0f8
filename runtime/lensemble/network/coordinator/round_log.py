"""The coordinator's round events in causal order, although commits are written behind.

Under :meth:`Coordinator.run` a committed round's checkpoint and ledger line are written on a
commit thread while the next round already opens (docs/performance.md#write-behind-commits),
and the round counts as committed once its ledger line is durable. Logged as they happen, the
events read "round 1 attempt 0 open" before "round 0 attempt 0 committed", as if a round could
open on a model not yet committed. :class:`RoundLog` holds the later rounds' events (their
opening, their verdicts) from the moment a commit is pending until its ``round_closed`` event
is logged, then logs them in the order they happened. Nothing is dropped: a commit that fails
releases what was held (:meth:`RoundLog.release`), after the error that says why.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from lensemble.federation.ledger import RoundRecord

Emit = Callable[[], None]


class RoundLog:
    """Orders round events around a commit written behind; thread-safe.

    Events are held only once something logs the commits (:meth:`logs_commits`, the
    coordinator's observer): with nobody to log a commit, holding would only delay them.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._commit_logger = False
        self._pending: int | None = None  # the round whose commit is being written
        self._held: list[Emit] = []

    def logs_commits(self) -> None:
        """Say that :meth:`committed` will be called for every commit from now on."""
        self._commit_logger = True

    def closed(self, record: RoundRecord) -> None:
        """An attempt was decided; a commit makes later events wait for its durable line."""
        if record.state == "closed" and self._commit_logger:
            with self._lock:
                self._pending = record.round

    def emit(self, log: Emit) -> None:
        """Log now, or after the pending commit's event when one is pending."""
        with self._lock:
            if self._pending is not None:
                self._held.append(log)
                return
            log()

    def committed(self, log: Emit) -> None:
        """Log a durable commit's event, then every event held behind it, in order."""
        with self._lock:
            log()
            self._release()

    def release(self) -> None:
        """Log whatever is held (the commit failed, or the process stops)."""
        with self._lock:
            self._release()

    def _release(self) -> None:
        held, self._held, self._pending = self._held, [], None
        for log in held:
            log()
