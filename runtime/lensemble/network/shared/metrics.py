"""Prometheus metrics of one process (served by :mod:`~lensemble.network.shared.metrics_server`).

Every process (coordinator or participant) has its own registry with the same metric names;
a metric a role does not use stays at zero. Label sets are bounded: ``participant`` takes only
the config's participant ids, ``reason`` the rejection reasons, ``direction`` ``up``/``down``,
``quantization`` the config's wire format. Names (all prefixed ``lensemble_``; docs/operations.md
says what each is for and which alert reads it):

==================================================  ===========================================
``round_index``                                     round being collected (coordinator) or trained
``round_attempt``                                   attempt of that round
``round_state``                                     round state machine (an enum metric)
``round_contributors``                              contributors of the last closed attempt
``quorum``                                          ``federation.quorum`` (coordinator)
``quorum_margin``                                   joined participants minus the quorum
``participants_joined``                             participants joined (coordinator)
``joined``                                          1 while joined to the coordinator (participant)
``model_version``                                   committed rounds so far, the ledger's count
``rounds_total{state}``                             closed / aborted round attempts
``bytes_in_total``, ``bytes_out_total``             payload bytes received / sent
``round_payload_bytes{direction,quantization}``     payload bytes of the last attempt
``round_duration_seconds``                          wall time of each round attempt
``round_non_compute_seconds``                       round wall time minus inner-step time
``round_non_compute_ratio``                         that, as a share of the attempt's wall time
``serialize_seconds``, ``deserialize_seconds``      (de)serialization time per round
``compute_seconds``                                 inner-step time per round (participant)
``inner_steps_per_second``, ``inner_loss``          last round's throughput and mean loss
                                                    (participant)
``round_mean_inner_loss``                           the ledger's mean inner loss (coordinator)
``round_loop_cpu_seconds_total``                    CPU time of the coordinator's round thread
``round_loop_utilisation_ratio``                    that per wall second, over the last attempt
``submission_deadline_margin_seconds``              round deadline minus each submission's arrival
``participant_last_seen_timestamp_seconds{p.}``     last call or update from each participant
``participant_missed_rounds{participant}``          consecutive attempts without its update
``updates_rejected_total{participant,reason}``      round attempts a participant's update was
                                                    excluded from, by reason (the ledger's)
``updates_clipped_total{participant,reason}``       updates clipped before aggregation
``accepted_submissions_total``                      updates accepted (including idempotent resends)
``rejected_submissions_total{reason}``              submissions rejected, by reason (every call)
``refused_calls_total{rpc,reason}``                 other calls refused (Join, WatchRounds, ...;
                                                    ``ModelDownload``: the download port)
``open_files_limit``                                soft open-file limit (descriptors)
``connection_limit{port}``                          connections a port may hold (coordinator)
``connections{port}``                               connections open on each port (coordinator)
``connections_closed_total{port,reason}``           connections closed by a cap (``per_address``)
==================================================  ===========================================
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram

from lensemble.federation.ledger import RoundRecord
from lensemble.federation.rounds import RoundState

_log = logging.getLogger("lensemble.network.metrics")
_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_SHORT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
#: Deadline margin buckets (seconds before the deadline; a late arrival is negative).
_MARGIN_BUCKETS = (-10, -1, 0, 1, 5, 10, 30, 60, 120, 300, 600)
#: ``RoundRecord.excluded`` reason of a participant that sent nothing: not a rejection.
TIMEOUT = "timeout"


class Metrics:
    """The metrics of one process, on a private registry.

    Args:
        registry: Where to register (a new private registry by default).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._define_round_metrics(self.registry)
        self._define_traffic_metrics(self.registry)
        self._define_time_metrics(self.registry)
        self._define_learning_metrics(self.registry)
        self._define_judging_metrics(self.registry)
        self._define_connection_metrics(self.registry)
        self._quorum = 0
        self._opening_at: float | None = None
        self._cpu_mark: tuple[float, float] | None = None

    def _define_round_metrics(self, r: CollectorRegistry) -> None:
        """Where the run is: the round, its attempt and state, who is joined."""
        self.round_index = Gauge(
            "lensemble_round_index", "Round being collected or trained.", registry=r
        )
        self.round_attempt = Gauge("lensemble_round_attempt", "Attempt of that round.", registry=r)
        self.round_state = Enum(
            "lensemble_round_state",
            "State of the current round attempt.",
            states=[s.value for s in RoundState],
            registry=r,
        )
        self.round_contributors = Gauge(
            "lensemble_round_contributors", "Contributors of the last closed attempt.", registry=r
        )
        self.rounds = Counter(
            "lensemble_rounds", "Round attempts by final state.", ["state"], registry=r
        )
        self.model_version = Gauge(
            "lensemble_model_version",
            "Rounds committed so far (the global model's version, the ledger's count).",
            registry=r,
        )
        self.participants_joined = Gauge(
            "lensemble_participants_joined", "Participants joined to the coordinator.", registry=r
        )
        self.joined = Gauge(
            "lensemble_joined", "1 while this participant is joined to the coordinator.", registry=r
        )
        self.quorum = Gauge("lensemble_quorum", "federation.quorum (participants).", registry=r)
        self.quorum_margin = Gauge(
            "lensemble_quorum_margin",
            "Participants joined minus the quorum; below 0 no round can commit.",
            registry=r,
        )

    def _define_traffic_metrics(self, r: CollectorRegistry) -> None:
        """Payload bytes moved."""
        self.bytes_in = Counter("lensemble_bytes_in", "Payload bytes received.", registry=r)
        self.bytes_out = Counter("lensemble_bytes_out", "Payload bytes sent.", registry=r)
        self.round_payload_bytes = Gauge(
            "lensemble_round_payload_bytes",
            "Payload bytes of the last round attempt, by direction (up: updates, down: models).",
            ["direction", "quantization"],
            registry=r,
        )

    def _define_time_metrics(self, r: CollectorRegistry) -> None:
        """Where a round's time goes: its wall time, compute, (de)serialization, the round loop."""
        self.round_duration = Histogram(
            "lensemble_round_duration_seconds",
            "Wall time of each round attempt (seconds).",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.round_non_compute = Histogram(
            "lensemble_round_non_compute_seconds",
            "Round wall time minus the inner-step time on its critical path (seconds).",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.round_non_compute_ratio = Gauge(
            "lensemble_round_non_compute_ratio",
            "Non-compute share of the last attempt's wall time (0..1).",
            registry=r,
        )
        self.compute = Histogram(
            "lensemble_compute_seconds",
            "Inner-step time per round (seconds).",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.serialize = Histogram(
            "lensemble_serialize_seconds",
            "Time encoding payloads per round: the global model (coordinator), the update "
            "(participant).",
            buckets=_SHORT_BUCKETS,
            registry=r,
        )
        self.deserialize = Histogram(
            "lensemble_deserialize_seconds",
            "Time decoding and checking payloads per round: updates (coordinator), the global "
            "model (participant).",
            buckets=_SHORT_BUCKETS,
            registry=r,
        )
        self.loop_cpu = Counter(
            "lensemble_round_loop_cpu_seconds",
            "CPU time of the coordinator's round thread (seconds).",
            registry=r,
        )
        self.loop_utilisation = Gauge(
            "lensemble_round_loop_utilisation_ratio",
            "CPU seconds of the coordinator's round thread per wall second, last attempt (0..1).",
            registry=r,
        )
        self.deadline_margin = Histogram(
            "lensemble_submission_deadline_margin_seconds",
            "Round deadline minus each update's arrival (seconds; negative: late).",
            buckets=_MARGIN_BUCKETS,
            registry=r,
        )

    def _define_learning_metrics(self, r: CollectorRegistry) -> None:
        """What training reports: throughput and inner loss."""
        self.inner_steps_per_second = Gauge(
            "lensemble_inner_steps_per_second",
            "Inner steps per second of this participant's last round.",
            registry=r,
        )
        self.inner_loss = Gauge(
            "lensemble_inner_loss",
            "Mean inner loss of this participant's last round (unitless).",
            registry=r,
        )
        self.privacy_epsilon = Gauge(
            "lensemble_privacy_epsilon_spent",
            "Differential-privacy epsilon this participant has spent so far, by its own "
            "accountant (unitless; 0 until it trains a round under DP).",
            registry=r,
        )
        self.round_mean_inner_loss = Gauge(
            "lensemble_round_mean_inner_loss",
            "The ledger's mean inner loss of the last committed round (unitless).",
            registry=r,
        )

    def _define_judging_metrics(self, r: CollectorRegistry) -> None:
        """Updates accepted, rejected, clipped; calls refused; each participant's record."""
        self.accepted = Counter("lensemble_accepted_submissions", "Updates accepted.", registry=r)
        self.rejected = Counter(
            "lensemble_rejected_submissions", "Updates rejected, by reason.", ["reason"], registry=r
        )
        self.refused_calls = Counter(
            "lensemble_refused_calls",
            "Calls other than SubmitUpdate refused, by RPC and reason.",
            ["rpc", "reason"],
            registry=r,
        )
        self.updates_rejected = Counter(
            "lensemble_updates_rejected",
            "Round attempts a participant's update was excluded from, by reason.",
            ["participant", "reason"],
            registry=r,
        )
        self.updates_clipped = Counter(
            "lensemble_updates_clipped",
            "Updates clipped before aggregation, by participant and reason.",
            ["participant", "reason"],
            registry=r,
        )
        self.last_seen = Gauge(
            "lensemble_participant_last_seen_timestamp_seconds",
            "Unix time of the last join, update or leave of each participant.",
            ["participant"],
            registry=r,
        )
        self.missed_rounds = Gauge(
            "lensemble_participant_missed_rounds",
            "Consecutive round attempts each participant did not contribute to.",
            ["participant"],
            registry=r,
        )

    def _define_connection_metrics(self, r: CollectorRegistry) -> None:
        """What the coordinator's ports hold (connection_budget.py, connection_warden.py)."""
        self.open_files_limit = Gauge(
            "lensemble_open_files_limit",
            "Soft open-file limit of the process (descriptors), raised to the hard one at start.",
            registry=r,
        )
        self.connection_limit = Gauge(
            "lensemble_connection_limit",
            "Connections a port may hold at once (coordinator).",
            ["port"],
            registry=r,
        )
        self.connections = Gauge(
            "lensemble_connections",
            "Connections open on a port of the coordinator.",
            ["port"],
            registry=r,
        )
        self.connections_closed = Counter(
            "lensemble_connections_closed",
            "Connections the coordinator closed because a cap was reached, by port and cap.",
            ["port", "reason"],
            registry=r,
        )

    def verdict(self, accepted: bool, reason: str) -> None:
        """Count one judged update."""
        if accepted:
            self.accepted.inc()
        else:
            self.rejected.labels(reason=reason).inc()

    # ----------------------------------------------------------------------- coordinator
    def federation(self, participants: Sequence[str], quorum: int) -> None:
        """Create each participant's series at zero and record the quorum.

        Args:
            participants: The config's participant ids (the only ``participant`` labels).
            quorum: ``federation.quorum``.
        """
        self._quorum = quorum
        self.quorum.set(quorum)
        self.quorum_margin.set(-quorum)
        for pid in participants:
            self.missed_rounds.labels(participant=pid).set(0)

    def set_joined(self, joined: int) -> None:
        """Participants joined now; the quorum margin follows."""
        self.participants_joined.set(joined)
        self.quorum_margin.set(joined - self._quorum)

    def seen(self, participant: str) -> None:
        """``participant`` called the coordinator just now."""
        self.last_seen.labels(participant=participant).set(time.time())

    def attempt_starting(self) -> None:
        """The coordinator's thread starts an attempt (call from that thread)."""
        self._opening_at = time.perf_counter()
        self._cpu_mark = (time.thread_time(), time.perf_counter())

    def round_opened(self, round_index: int, attempt: int) -> None:
        """The attempt's model is encoded and published (call from the coordinator's thread)."""
        self.round_index.set(round_index)
        self.round_attempt.set(attempt)
        if self._opening_at is not None:
            self.serialize.observe(time.perf_counter() - self._opening_at)
            self._opening_at = None

    def round_committed(self, record: RoundRecord) -> None:
        """A committed attempt's ledger line is durable: count it (any thread).

        ``model_version`` is the ledger's count, so it moves only now, not when the attempt
        closed (the coordinator may write its checkpoint and line behind, beside the next
        round). An aborted attempt changes nothing here.
        """
        if record.state == "closed":
            self.model_version.set(record.round + 1)
            if record.mean_inner_loss is not None:
                self.round_mean_inner_loss.set(record.mean_inner_loss)

    def round_closed(
        self,
        record: RoundRecord,
        participants: Sequence[str],
        *,
        deserialize_s: float,
        clipped: Mapping[str, str] | None = None,
    ) -> None:
        """Count one closed or aborted attempt (call from the coordinator's thread).

        Args:
            record: The attempt's ledger line.
            participants: Every participant id of the config.
            deserialize_s: Time spent decoding and checking this attempt's updates (seconds).
            clipped: Participant id -> clipping reason, for updates clipped before averaging.
        """
        self.rounds.labels(state=record.state).inc()
        self.round_contributors.set(len(record.contributors))
        self.round_duration.observe(record.wall_s)
        self.round_non_compute.observe(record.non_compute_s)
        if record.wall_s > 0:
            self.round_non_compute_ratio.set(record.non_compute_s / record.wall_s)
        self.deserialize.observe(deserialize_s)
        q = record.quantization
        self.round_payload_bytes.labels(direction="up", quantization=q).set(record.bytes_up)
        self.round_payload_bytes.labels(direction="down", quantization=q).set(record.bytes_down)
        contributed = set(record.contributors)
        for pid in participants:
            missed = self.missed_rounds.labels(participant=pid)
            if pid in contributed:
                missed.set(0)
            else:
                missed.inc()
        for pid, reason in record.excluded.items():
            if reason != TIMEOUT:
                self.updates_rejected.labels(participant=pid, reason=reason).inc()
        for pid, reason in (clipped or {}).items():
            self.updates_clipped.labels(participant=pid, reason=reason).inc()
        if self._cpu_mark is not None:
            cpu0, wall0 = self._cpu_mark
            cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
            self.loop_cpu.inc(max(0.0, cpu))
            if wall > 0:
                self.loop_utilisation.set(min(1.0, max(0.0, cpu / wall)))
            self._cpu_mark = None

    def submission_arrived(self, participant: str, deadline_margin_s: float) -> None:
        """An update arrived ``deadline_margin_s`` seconds before the round deadline."""
        self.seen(participant)
        self.deadline_margin.observe(deadline_margin_s)

    # ----------------------------------------------------------------------- participant
    def contributed(
        self,
        *,
        compute_s: float,
        serialize_s: float,
        deserialize_s: float,
        inner_steps: int,
        mean_loss: float,
        privacy_epsilon: float | None = None,
    ) -> None:
        """Count one trained round of this participant.

        Args:
            compute_s: Time in the inner steps (seconds).
            serialize_s: Time quantizing and sealing the update (seconds).
            deserialize_s: Time decoding and verifying the global model (seconds).
            inner_steps: Inner steps taken (``federation.inner_steps``).
            mean_loss: Mean inner loss (unitless), an aggregate the update carries anyway.
            privacy_epsilon: The differential-privacy epsilon spent so far (the participant's
                own accountant), or None without DP (the gauge stays unset).
        """
        self.compute.observe(compute_s)
        self.serialize.observe(serialize_s)
        self.deserialize.observe(deserialize_s)
        if compute_s > 0:
            self.inner_steps_per_second.set(inner_steps / compute_s)
        self.inner_loss.set(mean_loss)
        if privacy_epsilon is not None:
            self.privacy_epsilon.set(privacy_epsilon)
