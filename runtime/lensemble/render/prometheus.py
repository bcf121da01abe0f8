"""Prometheus for a rendered stack: its scrape config, the alert rules, the Compose service.

The alert rules (``monitoring/alerts.yaml`` in this package, runbooks in docs/operations.md)
are the same file for the chart (``charts/lensemble/files/alerts.yaml``, a generated copy) and
for the Compose ``monitoring`` profile, which runs Prometheus from Debian's package
(``image/prometheus/Dockerfile``) next to the stack. Every target gets a ``role`` label
(``coordinator``/``participant``) and participants a ``participant`` label; the rules and the
dashboard select on them.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from lensemble.config import LensembleConfig

#: The Compose profile, service and network of Prometheus.
MONITORING_PROFILE = "monitoring"
PROMETHEUS = "prometheus"
MONITORING_NETWORK = "monitoring"
#: Built by ``image/prometheus/Dockerfile`` on the Lensemble image's Debian base.
PROMETHEUS_IMAGE = "lensemble-prometheus:bookworm"
PROMETHEUS_PORT = 9090
#: The image's prometheus user (``PROMETHEUS_UID`` of image/prometheus/Dockerfile).
PROMETHEUS_UID = 990
#: File names next to the Compose file, and where the container reads them.
PROMETHEUS_CONFIG_NAME = "prometheus.yml"
ALERTS_NAME = "alerts.yaml"
CONFIG_DIR = "/etc/prometheus"
#: Small stacks, short rounds: scrape often enough to see each round.
SCRAPE_INTERVAL = "5s"


def alert_rules_text() -> str:
    """The alert rules file (Prometheus rule-file YAML), as shipped in this package."""
    return (resources.files("lensemble.render") / "monitoring" / ALERTS_NAME).read_text("utf-8")


def prometheus_config(
    config: LensembleConfig, coordinator_host: str, participant_hosts: dict[str, list[str]]
) -> dict[str, Any]:
    """Prometheus's configuration for one federation.

    Args:
        config: Gives the metrics port and path.
        coordinator_host: Host name of the coordinator.
        participant_hosts: Participant id -> host names it may run under (one per Compose
            profile). Names are resolved by DNS: only the running ones become targets, so the
            profile that is not started yields no target (and no false "down").

    Returns:
        The ``prometheus.yml`` mapping: global intervals, the rules file, one job for the
        coordinator and one per participant.
    """
    port = config.network.metrics_port
    path = config.observability.metrics_path
    jobs: list[dict[str, Any]] = [
        {
            "job_name": "lensemble-coordinator",
            "metrics_path": path,
            "static_configs": [
                {"targets": [f"{coordinator_host}:{port}"], "labels": {"role": "coordinator"}}
            ],
        }
    ]
    for pid, hosts in sorted(participant_hosts.items()):
        jobs.append(
            {
                "job_name": f"lensemble-participant-{pid}",
                "metrics_path": path,
                "dns_sd_configs": [
                    {"names": hosts, "type": "A", "port": port, "refresh_interval": "5s"}
                ],
                "relabel_configs": [
                    {"target_label": "role", "replacement": "participant"},
                    {"target_label": "participant", "replacement": pid},
                ],
            }
        )
    return {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
        "rule_files": [f"{CONFIG_DIR}/{ALERTS_NAME}"],
        "scrape_configs": jobs,
    }


def prometheus_service(networks: list[str], image: str = PROMETHEUS_IMAGE) -> dict[str, Any]:
    """The Compose service of Prometheus (profile ``monitoring``).

    It joins every participant's network (to scrape; those stay internal) and its own
    ``monitoring`` network, where its HTTP API is published on a free port of the host's
    loopback (``docker compose port prometheus 9090`` names it). Its data lives in a tmpfs:
    the ledger, not Prometheus, is the record of a run.
    """
    return {
        "image": image,
        "pull_policy": "never",
        "profiles": [MONITORING_PROFILE],
        "read_only": True,
        "user": f"{PROMETHEUS_UID}:{PROMETHEUS_UID}",
        # Owned by that user: a tmpfs does not take the image folder's owner.
        "tmpfs": [f"/prometheus:uid={PROMETHEUS_UID},gid={PROMETHEUS_UID}"],
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
        "init": True,
        "volumes": [
            {
                "type": "bind",
                "source": f"./{name}",
                "target": f"{CONFIG_DIR}/{name}",
                "read_only": True,
            }
            for name in (PROMETHEUS_CONFIG_NAME, ALERTS_NAME)
        ],
        "networks": [MONITORING_NETWORK, *networks],
        "ports": [f"127.0.0.1::{PROMETHEUS_PORT}"],
        "restart": "on-failure:3",
    }
