"""The files a Compose render writes: the Compose file, the container config, Prometheus's.

:func:`write_compose` writes, next to each other, the Compose file of
:func:`~lensemble.render.compose.render_compose` under a header that says where it came from and
how to start it, the config every container reads (``lensemble.yaml``), ``prometheus.yml`` and
the alert rules of the ``monitoring`` profile. The output is deterministic, so a committed render
is checked for staleness by rendering again (``tests/test_generated.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lensemble.config import LensembleConfig, config_hash, dump_config
from lensemble.render.compose import (
    CONTAINER_CONFIG_NAME,
    COORDINATOR,
    PROFILES,
    compose_container_config,
    participant_service,
    render_compose,
)
from lensemble.render.container import CONFIG_PATH
from lensemble.render.prometheus import (
    ALERTS_NAME,
    PROMETHEUS_CONFIG_NAME,
    alert_rules_text,
    prometheus_config,
)


@dataclass(frozen=True)
class ComposeFiles:
    """The files one render writes.

    Attributes:
        compose: The Compose file.
        config: The container config next to it, bind-mounted into every container.
        prometheus: Prometheus's config (the ``monitoring`` profile), next to it.
        alerts: The alert rules Prometheus loads, next to it.
    """

    compose: Path
    config: Path
    prometheus: Path | None = None
    alerts: Path | None = None


class _NoAliasDumper(yaml.SafeDumper):
    """Plain YAML: repeated values are written out, never as anchors and aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _comment(lines: Sequence[str]) -> str:
    return "".join(f"# {line}".rstrip() + "\n" for line in lines)


def compose_text(compose: dict[str, Any], header: Sequence[str] = ()) -> str:
    """The Compose mapping as YAML, after ``header`` lines written as comments."""
    body = yaml.dump(
        compose, Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=False, width=100
    )
    return _comment(header) + body


def container_config_text(config: LensembleConfig, header: Sequence[str] = ()) -> str:
    """The container config (:func:`compose_container_config`) as YAML after ``header``."""
    return _comment(header) + dump_config(compose_container_config(config))


def write_compose(
    config: LensembleConfig,
    output: Path,
    *,
    command: str = "",
    source: str = "",
    certs_dir: str = "certs",
    gpu_tag: str | None = None,
) -> ComposeFiles:
    """Render and write the Compose file and, next to it, the container config.

    The output is deterministic (no time stamps or absolute paths), so a committed render can
    be checked for staleness by rendering again and comparing.

    Args:
        config: The validated source config.
        output: Path of the Compose file; its folder is created when missing.
        command: The command line that regenerates the files, quoted in their headers.
        source: Where the config came from (file and overrides), quoted in the headers.
        certs_dir: See :func:`render_compose`.
        gpu_tag: See :func:`render_compose`.

    Returns:
        The paths written.

    Raises:
        ConfigError: See :func:`render_compose`.
        UsageError: See :func:`render_compose`.
        OSError: A file cannot be written.
    """
    compose = render_compose(config, certs_dir=certs_dir, gpu_tag=gpu_tag)
    config_path = output.parent / CONTAINER_CONFIG_NAME
    header = compose_header(config, command=command, source=source, certs_dir=certs_dir)
    config_header = [
        f"Rendered by `lensemble render compose`{f' from: {source}' if source else ''}",
        "The config every container of the Compose stack reads (mounted read-only at",
        f"{CONFIG_PATH}). Do not edit. Its config hash equals the source config's:",
        config_hash(config),
    ]
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(compose_text(compose, header), encoding="utf-8")
    config_path.write_text(container_config_text(config, config_header), encoding="utf-8")
    prometheus_path = output.parent / PROMETHEUS_CONFIG_NAME
    prometheus_path.write_text(prometheus_config_text(config, config_header[:1]), encoding="utf-8")
    alerts_path = output.parent / ALERTS_NAME
    alerts_path.write_text(alert_rules_text(), encoding="utf-8")
    return ComposeFiles(
        compose=output, config=config_path, prometheus=prometheus_path, alerts=alerts_path
    )


def prometheus_config_text(config: LensembleConfig, header: Sequence[str] = ()) -> str:
    """``prometheus.yml`` of the ``monitoring`` profile: it scrapes every service of the stack."""
    hosts = {
        pid: [participant_service(pid, profile) for profile in PROFILES]
        for pid in config.participant_ids
    }
    mapping = prometheus_config(config, COORDINATOR, hosts)
    lines = [*header, "Prometheus of the Compose `monitoring` profile. Do not edit."]
    return _comment(lines) + yaml.dump(
        mapping, Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=False, width=100
    )


def compose_header(
    config: LensembleConfig, *, command: str = "", source: str = "", certs_dir: str = "certs"
) -> list[str]:
    """Comment lines that open a rendered Compose file: provenance and how to start it."""
    project = config.run.name
    lines = [
        f"Rendered by `lensemble render compose`{f' from: {source}' if source else ''}",
        "Do not edit: change the config and render again" + (" with" if command else "."),
    ]
    if command:
        lines.append(f"  {command}")
    lines += [
        f"Config hash: {config_hash(config)}",
        "",
        "Easiest: `lensemble up --substrate compose --config FILE` renders, creates the",
        "certificates, starts the stack, waits for every ready line and follows the rounds.",
        "By hand, from this folder (pick ONE profile: cpu or gpu):",
    ]
    if config.network.tls.enabled:
        lines += [
            f"  lensemble certs init {certs_dir} --config {CONTAINER_CONFIG_NAME}",
            f"  chmod 700 {certs_dir} && chmod -R a+rX {certs_dir}/*/"
            "   # the image's user (UID 10001) reads its folder",
        ]
    lines += [
        f"  docker compose -p {project} --profile cpu up -d",
        f"  docker compose -p {project} --profile cpu down",
        "Add `--profile monitoring` for Prometheus with the alert rules (its image:",
        "image/prometheus/Dockerfile; `docker compose port prometheus 9090` gives its address).",
    ]
    return lines
