"""The Grafana dashboard of a federation, generated with Grafana's Python SDK.

    python -m tools.regenerate     # rewrites charts/lensemble/files/grafana-dashboard.json

:func:`dashboard_text` is the committed JSON (``grafana-foundation-sdk``, in the ``[dev]``
extra); ``tools/regenerate.py --check`` fails when the file is stale. The chart ships it as a
ConfigMap for Grafana's dashboard sidecar (``grafanaDashboard.enabled``). Every query selects
targets by their ``role`` label, as the alert rules do (docs/operations.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, timeseries
from grafana_foundation_sdk.builders.common import GraphThresholdsStyleConfig
from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DatasourceVariable,
    Row,
    ThresholdsConfig,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import GraphTresholdsStyleMode
from grafana_foundation_sdk.models.dashboard import DataSourceRef, Threshold, ThresholdsMode

UID = "lensemble-federation"
#: The design's budget for a round's non-compute share of wall time (the alert's threshold).
NON_COMPUTE_BUDGET = 0.25
C = 'role="coordinator"'
P = 'role="participant"'
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")


@dataclass(frozen=True)
class Query:
    """One PromQL query of a panel and its legend (``{{label}}`` placeholders)."""

    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    """One panel: title, kind (``timeseries``, ``stat``, ``state``), unit, queries.

    Attributes:
        budget: Draw this value as a red threshold line (timeseries only).
    """

    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"
    width: int = 12
    budget: float | None = None


#: Rows of panels, top to bottom; also what ``bench/dashboard_plot.py`` draws without Grafana.
ROWS: tuple[tuple[str, tuple[PanelSpec, ...]], ...] = (
    (
        "Rounds",
        (
            PanelSpec(
                "Round state",
                "The coordinator's round state machine over time.",
                (Query(f"lensemble_round_state{{{C}}} == 1", "{{lensemble_round_state}}"),),
                kind="state",
                width=24,
            ),
            PanelSpec(
                "Round and committed rounds",
                "Round being collected and the model version (rounds committed, the ledger's "
                "count).",
                (
                    Query(f"lensemble_round_index{{{C}}}", "round"),
                    Query(f"lensemble_model_version{{{C}}}", "committed"),
                ),
                kind="stat",
                width=6,
            ),
            PanelSpec(
                "Contributors vs quorum",
                "Contributors of the last attempt and participants joined, against the quorum.",
                (
                    Query(f"lensemble_round_contributors{{{C}}}", "contributors"),
                    Query(f"lensemble_participants_joined{{{C}}}", "joined"),
                    Query(f"lensemble_quorum{{{C}}}", "quorum"),
                ),
                width=9,
            ),
            PanelSpec(
                "Round attempts by outcome",
                "Closed and aborted attempts per interval.",
                (
                    Query(
                        f"sum by (state) (increase(lensemble_rounds_total{{{C}}}[5m]))",
                        "{{state}}",
                    ),
                ),
                width=9,
            ),
        ),
    ),
    (
        "Participants",
        (
            PanelSpec(
                "Seconds since last seen",
                "Time since each participant's last join, update or leave.",
                (
                    Query(
                        f"time() - lensemble_participant_last_seen_timestamp_seconds{{{C}}}",
                        "{{participant}}",
                    ),
                ),
                unit="s",
                width=8,
            ),
            PanelSpec(
                "Missed rounds",
                "Consecutive attempts without the participant's update (alert at 3).",
                (Query(f"lensemble_participant_missed_rounds{{{C}}}", "{{participant}}"),),
                width=8,
            ),
            PanelSpec(
                "Rejected and clipped updates (1 h)",
                "Updates left out (rejected) or clipped, by participant and reason.",
                (
                    Query(
                        "sum by (participant, reason) "
                        f"(increase(lensemble_updates_rejected_total{{{C}}}[1h]))",
                        "rejected {{participant}} {{reason}}",
                    ),
                    Query(
                        "sum by (participant, reason) "
                        f"(increase(lensemble_updates_clipped_total{{{C}}}[1h]))",
                        "clipped {{participant}} {{reason}}",
                    ),
                ),
                width=8,
            ),
            PanelSpec(
                "Inner-step throughput",
                "Inner steps per second of each participant's last round.",
                (Query(f"lensemble_inner_steps_per_second{{{P}}}", "{{participant}}"),),
                unit="ops",
            ),
            PanelSpec(
                "Inner loss",
                "Each participant's mean inner loss and the ledger's mean over contributors.",
                (
                    Query(f"lensemble_inner_loss{{{P}}}", "{{participant}}"),
                    Query(f"lensemble_round_mean_inner_loss{{{C}}}", "ledger mean"),
                ),
            ),
        ),
    ),
    (
        "Cost",
        (
            PanelSpec(
                "Payload bytes per round",
                "Bytes of the last attempt: up (updates received), down (models sent).",
                (Query(f"lensemble_round_payload_bytes{{{C}}}", "{{direction}} {{quantization}}"),),
                unit="bytes",
                width=8,
            ),
            PanelSpec(
                "Non-compute overhead vs budget",
                "Share of each attempt's wall time outside the inner steps; the red line is "
                "the budget.",
                (Query(f"lensemble_round_non_compute_ratio{{{C}}}", "non-compute share"),),
                unit="percentunit",
                width=8,
                budget=NON_COMPUTE_BUDGET,
            ),
            PanelSpec(
                "Coordinator thread utilisation",
                "CPU seconds of the coordinator's round thread per wall second (near 1: the "
                "coordinator is the bottleneck).",
                (
                    Query(f"rate(lensemble_round_loop_cpu_seconds_total{{{C}}}[5m])", "5 m rate"),
                    Query(f"lensemble_round_loop_utilisation_ratio{{{C}}}", "last attempt"),
                ),
                unit="percentunit",
                width=8,
            ),
            PanelSpec(
                "Serialize and deserialize seconds per round",
                "Mean per round: coordinator model encode and update decode; participants' "
                "model decode and update encode.",
                (
                    Query(
                        "sum by (role) (rate(lensemble_serialize_seconds_sum[5m])) / sum by "
                        "(role) (rate(lensemble_serialize_seconds_count[5m]))",
                        "serialize {{role}}",
                    ),
                    Query(
                        "sum by (role) (rate(lensemble_deserialize_seconds_sum[5m])) / sum by "
                        "(role) (rate(lensemble_deserialize_seconds_count[5m]))",
                        "deserialize {{role}}",
                    ),
                ),
                unit="s",
            ),
            PanelSpec(
                "Submission deadline margin",
                "Round deadline minus each update's arrival (scheduling jitter; below 0: late).",
                (
                    Query(
                        "histogram_quantile(0.1, sum by (le) (rate("
                        f"lensemble_submission_deadline_margin_seconds_bucket{{{C}}}[5m])))",
                        "p10",
                    ),
                    Query(
                        "histogram_quantile(0.5, sum by (le) (rate("
                        f"lensemble_submission_deadline_margin_seconds_bucket{{{C}}}[5m])))",
                        "median",
                    ),
                ),
                unit="s",
            ),
        ),
    ),
)


def _targets(spec: PanelSpec) -> list[prometheus.Dataquery]:
    return [
        prometheus.Dataquery().expr(q.expr).legend_format(q.legend).ref_id(chr(ord("A") + i))
        for i, q in enumerate(spec.queries)
    ]


def _panel(spec: PanelSpec) -> timeseries.Panel | stat.Panel | statetimeline.Panel:
    panel: timeseries.Panel | stat.Panel | statetimeline.Panel
    if spec.kind == "state":
        panel = statetimeline.Panel()
    elif spec.kind == "stat":
        panel = stat.Panel()
    else:
        panel = timeseries.Panel()
        if spec.budget is not None:
            panel = panel.thresholds(
                ThresholdsConfig()
                .mode(ThresholdsMode.ABSOLUTE)
                .steps([Threshold(None, "green"), Threshold(spec.budget, "red")])
            ).thresholds_style(GraphThresholdsStyleConfig().mode(GraphTresholdsStyleMode.LINE))
    panel = panel.title(spec.title).description(spec.description).datasource(DATASOURCE)
    panel = panel.unit(spec.unit).span(spec.width).height(7)
    for target in _targets(spec):
        panel = panel.with_target(target)
    return panel


def build_dashboard() -> Dashboard:
    """The dashboard builder: a data-source variable, then one row per :data:`ROWS` entry."""
    board = (
        Dashboard("Lensemble federation")
        .uid(UID)
        .description(
            "Rounds, participants and costs of a Lensemble federation (docs/operations.md)."
        )
        .tags(["lensemble", "federated-learning"])
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("utc")
        .with_variable(DatasourceVariable("datasource").label("Data source").type("prometheus"))
    )
    for title, panels in ROWS:
        board = board.with_row(Row(title))
        for spec in panels:
            board = board.with_panel(_panel(spec))
    return board


def dashboard_text() -> str:
    """The exact text of ``charts/lensemble/files/grafana-dashboard.json``."""
    return json.dumps(build_dashboard().build(), cls=JSONEncoder, sort_keys=True, indent=2) + "\n"
