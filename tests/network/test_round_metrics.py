"""The round metrics the design budgets for, fed from ledger lines (no server, no round)."""

from __future__ import annotations

from typing import Any

from lensemble.federation.ledger import RoundRecord
from lensemble.network.shared.metrics import Metrics

PIDS = ["alpine", "coastal", "desert"]


def _record(state: str, contributors: list[str], excluded: dict[str, str], **kw: Any) -> Any:
    fields: dict[str, Any] = dict(
        round=kw.pop("round", 0),
        attempt=0,
        state=state,
        contributors=contributors,
        excluded=excluded,
        parent_hash="p",
        model_hash="m",
        mean_inner_loss=0.5,
        bytes_up=300,
        bytes_down=900,
        quantization="int8",
        wall_s=2.0,
        compute_s=1.5,
        non_compute_s=0.5,
        config_hash="c",
    )
    fields.update(kw)
    return RoundRecord(**fields)


def _value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_quorum_margin_follows_joins() -> None:
    metrics = Metrics()
    metrics.federation(PIDS, quorum=2)
    assert _value(metrics, "lensemble_quorum_margin") == -2
    metrics.set_joined(3)
    assert _value(metrics, "lensemble_quorum_margin") == 1
    assert _value(metrics, "lensemble_quorum") == 2


def test_rejections_the_ledger_records_are_counted_by_participant_and_reason() -> None:
    metrics = Metrics()
    metrics.federation(PIDS, quorum=2)
    metrics.attempt_starting()
    metrics.round_closed(
        _record("closed", ["alpine"], {"coastal": "non_finite", "desert": "timeout"}),
        PIDS,
        deserialize_s=0.25,
        clipped={"alpine": "norm"},
    )
    rejected = "lensemble_updates_rejected_total"
    assert _value(metrics, rejected, participant="coastal", reason="non_finite") == 1
    # A participant that sent nothing was not rejected: it is missing.
    assert _value(metrics, rejected, participant="desert", reason="timeout") is None
    assert _value(metrics, "lensemble_updates_clipped_total", participant="alpine", reason="norm")
    assert _value(metrics, "lensemble_participant_missed_rounds", participant="desert") == 1
    assert _value(metrics, "lensemble_participant_missed_rounds", participant="alpine") == 0
    # The ledger's count moves when the line is durable, not when the attempt closes.
    assert _value(metrics, "lensemble_model_version") == 0
    metrics.round_committed(
        _record("closed", ["alpine"], {"coastal": "non_finite", "desert": "timeout"})
    )
    assert _value(metrics, "lensemble_model_version") == 1
    assert _value(metrics, "lensemble_round_non_compute_ratio") == 0.25
    assert _value(metrics, "lensemble_deserialize_seconds_sum") == 0.25
    up = {"direction": "up", "quantization": "int8"}
    assert _value(metrics, "lensemble_round_payload_bytes", **up) == 300
    assert _value(metrics, "lensemble_round_loop_cpu_seconds_total") is not None
    assert 0 <= (_value(metrics, "lensemble_round_loop_utilisation_ratio") or 0) <= 1


def test_missed_rounds_count_consecutive_attempts_and_reset_on_a_contribution() -> None:
    metrics = Metrics()
    metrics.federation(PIDS, quorum=1)
    for attempt in range(3):
        metrics.round_closed(
            _record("aborted", [], {p: "timeout" for p in PIDS}, attempt=attempt),
            PIDS,
            deserialize_s=0.0,
        )
    assert _value(metrics, "lensemble_participant_missed_rounds", participant="alpine") == 3
    assert _value(metrics, "lensemble_model_version") == 0
    assert _value(metrics, "lensemble_rounds_total", state="aborted") == 3
    metrics.round_closed(
        _record("closed", ["alpine"], {"coastal": "timeout", "desert": "timeout"}),
        PIDS,
        deserialize_s=0.0,
    )
    assert _value(metrics, "lensemble_participant_missed_rounds", participant="alpine") == 0
    assert _value(metrics, "lensemble_participant_missed_rounds", participant="coastal") == 4


def test_a_participant_exports_throughput_loss_and_codec_times() -> None:
    metrics = Metrics()
    metrics.contributed(
        compute_s=2.0, serialize_s=0.1, deserialize_s=0.2, inner_steps=50, mean_loss=0.75
    )
    assert _value(metrics, "lensemble_inner_steps_per_second") == 25
    assert _value(metrics, "lensemble_inner_loss") == 0.75
    assert _value(metrics, "lensemble_serialize_seconds_sum") == 0.1
    assert _value(metrics, "lensemble_deserialize_seconds_sum") == 0.2
    assert _value(metrics, "lensemble_compute_seconds_count") == 1


def test_a_private_participant_exports_the_epsilon_it_has_spent() -> None:
    metrics = Metrics()
    metrics.contributed(
        compute_s=1.0, serialize_s=0.1, deserialize_s=0.1, inner_steps=5, mean_loss=0.5
    )
    assert _value(metrics, "lensemble_privacy_epsilon_spent") == 0  # never set without DP
    for spent in (1.45, 2.02):
        metrics.contributed(
            compute_s=1.0,
            serialize_s=0.1,
            deserialize_s=0.1,
            inner_steps=5,
            mean_loss=float("nan"),
            privacy_epsilon=spent,
        )
        assert _value(metrics, "lensemble_privacy_epsilon_spent") == spent
