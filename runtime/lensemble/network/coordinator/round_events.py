"""The coordinator's observer: every round state, verdict and closed attempt as events and metrics.

Passed to the federation :class:`~lensemble.federation.coordinator.Coordinator` as its
``observer``: it counts each verdict, tracks the round state machine in
``lensemble_round_state`` and logs ``verdict`` and ``round_closed`` events (logger
``lensemble.network.rounds``) through the ``RoundLog`` it shares with the transport
(:mod:`lensemble.network.coordinator.round_log`), so no round's events precede the commit of
the round before it.
"""

from __future__ import annotations

import logging

from lensemble.federation.ledger import RoundRecord
from lensemble.federation.messages import Submission, Verdict
from lensemble.federation.rounds import RoundState
from lensemble.network.coordinator.round_log import RoundLog
from lensemble.network.shared.logs import event
from lensemble.network.shared.metrics import Metrics
from lensemble.network.shared.peer_text import shown


class CoordinatorEvents:
    """Coordinator observer: structured log events and metrics.

    Args:
        metrics: Where to count verdicts and track the round state.
        quorum: ``federation.quorum`` (named in an aborted attempt's event).
        round_log: The causal order shared with the transport (a private one by default).
    """

    def __init__(self, metrics: Metrics, quorum: int, round_log: RoundLog | None = None) -> None:
        self.metrics = metrics
        self.quorum = quorum
        self.round_log = round_log or RoundLog()
        self.round_log.logs_commits()  # on_round logs every commit
        self._log = logging.getLogger("lensemble.network.rounds")

    def on_state(self, round_index: int, attempt: int, state: RoundState) -> None:
        """Track the round state machine (and time the attempt from its opening)."""
        if state == RoundState.OPEN:
            self.metrics.attempt_starting()
        self.metrics.round_state.state(state.value)

    def on_verdict(self, submission: Submission, verdict: Verdict) -> None:
        """Count and log each judged update."""
        self.metrics.verdict(verdict.accepted, verdict.reason.value)
        message = f"round {submission.round_index}: {submission.sender} {verdict.reason.value}"
        message += "" if verdict.accepted else f" ({shown(verdict.message)})"
        fields = {
            "round": submission.round_index,
            "participant": submission.sender,
            "reason": verdict.reason.value,
            "bytes": len(submission.payload),
        }
        level = logging.INFO if verdict.accepted else logging.WARNING
        self.round_log.emit(lambda: event(self._log, "verdict", message, level, **fields))

    def on_round(self, record: RoundRecord) -> None:
        """Log each closed or aborted attempt with its lineage."""
        what = (
            f"committed {record.model_hash[:19]}..."
            if record.state == "closed"
            else f"aborted ({len(record.contributors)} of {self.quorum} required contributors)"
        )
        message = (
            f"round {record.round} attempt {record.attempt} {what}; contributors "
            f"{', '.join(record.contributors) or 'none'}"
            + (f"; excluded {record.excluded}" if record.excluded else "")
        )

        def log() -> None:
            event(
                self._log,
                "round_closed",
                message,
                round=record.round,
                attempt=record.attempt,
                state=record.state,
                contributors=record.contributors,
                excluded=record.excluded,
                model_hash=record.model_hash,
                bytes_up=record.bytes_up,
                bytes_down=record.bytes_down,
                wall_s=record.wall_s,
                non_compute_s=record.non_compute_s,
                # What the console names of the defences (lensemble.cli.progress.defence_notes).
                clipped=record.defences.get("clipped") or {},
                set_aside=record.defences.get("set_aside") or {},
            )

        if record.state == "closed":  # its line is durable: what waited behind it follows
            self.round_log.committed(log)
        else:
            self.round_log.emit(log)
