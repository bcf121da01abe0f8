"""Inside a container: the paths of the process contract, and the config a container reads.

``docs/architecture.md`` fixes where a containerised process finds its config, TLS material and
writable state. Compose and the Helm chart mount things there, and both rewrite the source config
for containers with :func:`container_config`, which changes only fields the config hash leaves
out, so every container reports the source config's hash in its ready line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI reads the paths at start-up; the config models load on use
    from lensemble.config.schema import LensembleConfig

#: The config file every container reads (``LENSEMBLE_CONFIG``), mounted read-only.
CONFIG_PATH = "/etc/lensemble/config.yaml"
#: Where TLS material is mounted (read-only).
TLS_DIR = "/etc/lensemble/tls"
#: TLS folder on Kubernetes: one Secret per identity, each in its own sub-folder.
POD_TLS_DIR = f"{TLS_DIR}/{{identity}}"
#: Writable state: ``run.output_dir`` of every container.
STATE_DIR = "/var/lib/lensemble"
#: Scratch space (tmpfs or emptyDir); the root filesystem is read-only.
SCRATCH_DIR = "/tmp"  # noqa: S108 - the contract's private scratch mount
#: Address a containerised process listens on: every interface of its own network namespace.
LISTEN_ALL = "0.0.0.0"  # noqa: S104


def pod_contract() -> dict[str, str]:
    """Field path -> the value every containerised process's config carries.

    A container config with another value is refused or silently broken: a loopback
    ``network.listen_host`` never passes a probe, another ``run.output_dir`` writes to the
    read-only root filesystem. :func:`container_config` writes these; the chart's values schema
    requires them.
    """
    return {
        "run.output_dir": STATE_DIR,
        "federation.transport": "network",
        "network.listen_host": LISTEN_ALL,
    }


def tls_paths(tls_dir: str) -> dict[str, str]:
    """``network.tls`` field -> the file a container finds under ``tls_dir`` (TLS on)."""
    return {
        "ca_file": f"{tls_dir}/ca.crt",
        "cert_file": f"{tls_dir}/tls.crt",
        "key_file": f"{tls_dir}/tls.key",
    }


def container_config(
    config: LensembleConfig, *, coordinator_host: str, tls_dir: str
) -> LensembleConfig:
    """The config as a container reads it: network transport, container paths, JSON logs.

    Changes ``federation.transport`` (``network``), ``network.host`` (``coordinator_host``),
    ``network.listen_host`` (all interfaces), ``run.output_dir`` (:data:`STATE_DIR`), the TLS
    paths (``<tls_dir>/ca.crt``, ``tls.crt``, ``tls.key``) when TLS is on, and
    ``observability.log_format`` (``json``).

    Args:
        config: The validated source config.
        coordinator_host: The host name participants dial in this substrate.
        tls_dir: The folder holding one identity's TLS files, e.g. :data:`TLS_DIR` (Compose
            mounts the identity's own folder) or ``/etc/lensemble/tls/{identity}`` (Kubernetes
            mounts every identity of a pod in its own sub-folder).

    Returns:
        The validated container config; its config hash equals the source's.

    Raises:
        ConfigError: The changed config fails validation.
        IntegrityError: The rewrite changed the config hash (a bug in this function).
    """
    from lensemble.config.hashing import config_hash
    from lensemble.config.load import validate_mapping
    from lensemble.errors import IntegrityError

    data = config.model_dump(mode="json")
    for path, value in pod_contract().items():
        section, field = path.split(".")
        data[section][field] = value
    data["observability"]["log_format"] = "json"
    network = data["network"]
    network["host"] = coordinator_host
    if network["tls"]["enabled"]:
        network["tls"].update(tls_paths(tls_dir))
    out = validate_mapping(data, source="<container config>")
    if config_hash(out) != config_hash(config):
        raise IntegrityError(
            "the container config changed the config hash; this is a bug in "
            "lensemble.render.container, please report it."
        )
    return out
