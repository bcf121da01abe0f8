"""When a participant retries a call the coordinator did not answer, and when it gives up.

A transient failure (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``, ...) waits a backoff delay
(:class:`~lensemble.network.participant.backoff.Backoff`) and logs ``retry``; the first one marks
the participant not ready until a call succeeds again (``reconnected``). A certificate failure is
never retried: the same certificates fail the same way. After ``federation.join_timeout_s`` of
failures the participant gives up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from lensemble.network.participant.backoff import Backoff
from lensemble.network.participant.call_errors import CallError
from lensemble.network.shared import transport_errors as nerr
from lensemble.network.shared.logs import event
from lensemble.network.shared.peer_text import shown
from lensemble.network.shared.transport_errors import CoordinatorUnreachable

_log = logging.getLogger("lensemble.network.participant")


class Retries:
    """The retry state of one participant's calls to the coordinator.

    Args:
        target: ``host:port`` of the coordinator (named in the errors).
        join_timeout_s: How long failures may last before the participant gives up
            (``federation.join_timeout_s``; seconds).
        backoff: The delays between attempts.
        stop: Set to stop: a wait between attempts ends at once.
        on_ready: Called with False at the first failure, True once a call succeeds again.
    """

    def __init__(
        self,
        *,
        target: str,
        join_timeout_s: float,
        backoff: Backoff,
        stop: threading.Event,
        on_ready: Callable[[bool], None],
    ) -> None:
        self.target = target
        self.join_timeout_s = join_timeout_s
        self.backoff = backoff
        self.stop = stop
        self._on_ready = on_ready
        self._failing_since: float | None = None

    def succeeded(self) -> None:
        """A call went through: the delays start over (and the participant is ready again)."""
        if self._failing_since is not None:
            down_s = time.monotonic() - self._failing_since
            event(_log, "reconnected", f"reached the coordinator after {down_s:.1f} s of retries.")
            self._on_ready(True)
        self._failing_since = None
        self.backoff.reset()

    def failed(self, what: str, error: CallError) -> None:
        """Wait before retrying a transient failure; give up after ``join_timeout_s``.

        Returns early when :attr:`stop` is set.

        Raises:
            CertificateRejected: The failure is a TLS certificate problem: no retry can fix it.
            CoordinatorUnreachable: Still failing after ``federation.join_timeout_s``.
        """
        cause = nerr.certificate_failure(error.message)
        if cause is not None:
            raise nerr.CertificateRejected(
                f"the TLS handshake with the coordinator at {self.target} failed: "
                f"{cause} ({shown(error.message)});",
                remediation="renew or replace the certificate (`lensemble certs init` renews a "
                "development set; docs/troubleshooting.md).",
            )
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
            self._on_ready(False)
        limit = self.join_timeout_s
        if now - self._failing_since > limit:
            raise CoordinatorUnreachable(
                f"the coordinator at {self.target} has not answered for "
                f"{now - self._failing_since:.0f} s (federation.join_timeout_s is {limit} s; "
                f"last error {error});",
                remediation="check that the coordinator runs and that network.host and "
                "network.port point at it.",
            )
        delay = self.backoff.next_delay()
        event(
            _log,
            "retry",
            f"{what} failed (attempt {self.backoff.attempt}, {error}); retrying in {delay:.1f} s.",
            logging.WARNING,
            attempt=self.backoff.attempt,
            delay_s=round(delay, 3),
            reason=error.reason,
        )
        self.stop.wait(delay)
