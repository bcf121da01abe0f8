"""Docker Compose renderer: a Compose file, and the config its containers read, from one config.

A contributor runs every participant and the coordinator on one machine
from the same ``LensembleConfig``. The rendered stack relies only on the process contract in
``docs/architecture.md``:

- one ``coordinator`` service, and per participant one service per profile: ``participant-<id>``
  (profile ``cpu``) and ``participant-<id>-gpu`` (profile ``gpu``, GPUs reserved through
  ``deploy.resources.reservations.devices``). Start one profile, never both. The coordinator
  belongs to both profiles;
- each participant's private data lives on its own named volume (``data-<id>``) that only that
  participant's services mount (residency), and each participant has its own internal network
  (``net-<id>``) shared only with the coordinator, so participants cannot reach each other or the
  internet;
- the coordinator keeps checkpoints and the ledger on the ``coordinator-state`` volume, so a
  restarted coordinator resumes;
- every container reads the same config, rendered next to the Compose file (``lensemble.yaml``)
  and bind-mounted read-only at ``/etc/lensemble/config.yaml``. It is the source config with only
  container-specific fields changed (coordinator host name, listen address, TLS paths, output
  directory, JSON logs), none of which the config hash covers, so every container reports the
  source config's hash in its ready line;
- TLS material comes from the folder ``lensemble certs init`` fills: each service mounts only its
  own identity folder (``<certs>/coordinator`` or ``<certs>/<participant id>``) read-only at
  ``/etc/lensemble/tls``; the CA key is never mounted;
- containers run as the image's non-root user (UID 10001) with a read-only root filesystem, a
  tmpfs ``/tmp``, no capabilities, restart on failure (bounded) and the CPU and memory limits of
  ``deployment.resources``;
- a participant with several ranks (``federation.ranks``, ``processes_per_node`` > 1) runs all
  of them in its one container: ``lensemble participant`` starts the local ranks under torch's
  elastic launcher (gloo in the ``cpu`` profile). Its limits are the per-rank CPU and memory
  times the ranks, its shared memory (``shm_size``) grows with them, and in the ``gpu`` profile
  it reserves one GPU per rank (:mod:`lensemble.render.ranks`). A group that spans several
  hosts (``nodes`` > 1) cannot run on one machine's Compose stack and is refused;
- the ``monitoring`` profile adds Prometheus (:mod:`lensemble.render.prometheus`): it joins
  every participant's network to scrape the metrics ports, loads the alert rules, and publishes
  its HTTP API on the host's loopback. Start it together with ``cpu`` or ``gpu``.

Everything here is validated with Debian's ``docker-compose`` 1.29 as well as Compose v2, so it
uses no newer syntax: in particular the project name is not in the file (1.29 rejects the
top-level ``name``); pass it with ``-p`` (``lensemble up`` does).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import PurePosixPath
from typing import Any

from lensemble.config import LensembleConfig, config_hash
from lensemble.config.schema import CUDA_TAG, ParticipantSpec
from lensemble.config.sections import cpu_cores
from lensemble.errors import ConfigError, ConfigProblem, UsageError
from lensemble.render.container import (
    CONFIG_PATH,
    SCRATCH_DIR,
    STATE_DIR,
    TLS_DIR,
    container_config,
)
from lensemble.render.names import COORDINATOR as COORDINATOR_IDENTITY
from lensemble.render.prometheus import (
    MONITORING_NETWORK,
    PROMETHEUS,
    prometheus_service,
)
from lensemble.render.ranks import RankPod, layout_field, rank_pod

#: The coordinator's service name: its identity, so its certificate folder has the same name.
COORDINATOR = COORDINATOR_IDENTITY
#: The image's non-root user and group (see the Dockerfile).
IMAGE_USER = "10001:10001"

COORDINATOR_VOLUME = "coordinator-state"
PROFILES = ("cpu", "gpu")
#: CUDA line of the gpu profile when the config's tag is a CPU build: CUDA 12.6 wheels run on
#: any NVIDIA driver >= 525 (CUDA minor-version compatibility), the widest 12.x reach.
DEFAULT_GPU_LINE = "cu126"
#: File name of the rendered container config, next to the Compose file.
CONTAINER_CONFIG_NAME = "lensemble.yaml"
#: Label keys on every rendered service, network and volume.
LABEL_RUN = "dev.lensemble.run"
LABEL_ROLE = "dev.lensemble.role"
LABEL_PARTICIPANT = "dev.lensemble.participant"
LABEL_TRUST_DOMAIN = "dev.lensemble.trust-domain"
LABEL_PROFILE = "dev.lensemble.profile"
LABEL_RANKS = "dev.lensemble.ranks"

#: A crashed process restarts (the coordinator resumes from its checkpoint volume); one that
#: keeps failing stops after three restarts so the failure surfaces instead of looping.
RESTART_POLICY = "on-failure:3"
HEALTH_INTERVAL = "5s"
#: The check is a whole `lensemble health` process that shares the container's CPU limit with a
#: busy trainer (what it costs: docs/performance.md#images-and-the-compose-stack).
HEALTH_TIMEOUT = "10s"
HEALTH_RETRIES = 5
#: Importing torch and building the model takes a while on a cold, small machine.
HEALTH_START_PERIOD = "60s"
#: Extra seconds after the longest RPC for a graceful SIGTERM shutdown (checkpoint, leave).
STOP_GRACE_MARGIN_S = 10
#: Open-file limit (soft and hard) of every container: each connection a coordinator holds is
#: a descriptor, and Docker's default soft limit can be 1,024. The coordinator budgets its
#: ports below it (docs/operations.md#file-descriptors). A container cannot get more than the
#: engine's own hard limit (runc refuses to start it: "error setting rlimit type 7"), which
#: is 20,000 on our CI engine and 524,288 or more under systemd; 8,192 fits under both.
NOFILE = 8192

#: Kubernetes pull policy -> Compose. 'if_not_present' rather than v2's 'missing': Compose v2
#: accepts both, docker-compose 1.29 only the former.
PULL_POLICY = {"Always": "always", "IfNotPresent": "if_not_present", "Never": "never"}

_TAG_LINE = re.compile(r"^(?P<version>.+)-(?P<line>cpu|cu[0-9]{3})$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_DECIMAL = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


# ------------------------------------------------------------------------------- the config
def check_composable(config: LensembleConfig) -> None:
    """Refuse configs the Compose stack cannot run, naming the field and the fix.

    Raises:
        ConfigError: The transport is not ``network``, authentication is ``token`` (no token
            files are rendered for Compose), a participant id would collide with another
            participant's gpu service name, or a participant's ranks span several nodes.
    """
    problems: list[ConfigProblem] = []
    if config.federation.transport != "network":
        problems.append(
            ConfigProblem(
                "federation.transport",
                f"'{config.federation.transport}' runs every role in one process, but Compose "
                "runs each in its own container; set it to 'network' (e.g. --set "
                "federation.transport=network).",
            )
        )
    if config.network.auth == "token":
        problems.append(
            ConfigProblem(
                "network.auth",
                "'token' is not rendered for Compose (no token files are mounted); use 'mtls' "
                "with `lensemble certs init`, or 'insecure' on a trusted machine.",
            )
        )
    ids = {p.id for p in config.federation.participants}
    for i, p in enumerate(config.federation.participants):
        base = p.id.removesuffix("-gpu")
        if base != p.id and base in ids:
            problems.append(
                ConfigProblem(
                    f"federation.participants[{i}].id",
                    f"'{p.id}' collides with the gpu service of participant '{base}' in Compose "
                    f"(participant-{p.id}); rename one of them.",
                )
            )
    for pid in config.participant_ids:
        layout = config.rank_layout(pid)
        if layout.nodes > 1:
            problems.append(
                ConfigProblem(
                    layout_field(config, pid, "nodes"),
                    f"{layout.nodes} nodes for participant '{pid}', but Compose runs each "
                    "participant in one container on one machine; set nodes: 1 and "
                    f"processes_per_node: {layout.world_size} to run all its ranks in that "
                    "container, or deploy it on Kubernetes.",
                )
            )
    if problems:
        raise ConfigError(problems)


def compose_container_config(config: LensembleConfig) -> LensembleConfig:
    """The config every container of the stack reads (see :func:`container_config`).

    The coordinator is the service ``coordinator``; each container mounts only its own identity
    folder at ``/etc/lensemble/tls``. The config hash equals the source's.

    Raises:
        ConfigError: The changed config fails validation (a bug: report it).
    """
    return container_config(config, coordinator_host=COORDINATOR, tls_dir=TLS_DIR)


# ------------------------------------------------------------------------------- the images
def profile_images(config: LensembleConfig, gpu_tag: str | None = None) -> dict[str, str]:
    """Image reference of each profile, following the tag scheme ``<version>-<line>``.

    The config's tag serves the profile it was built for; the other profile swaps the line
    (``0.1.0-cpu`` <-> ``0.1.0-cu126``). ``gpu_tag`` overrides the gpu profile's tag.

    Args:
        config: The source config (``deployment.image``).
        gpu_tag: Tag of the gpu profile's image, or None to derive it.

    Returns:
        ``{"cpu": "repo:tag", "gpu": "repo:tag"}``.

    Raises:
        UsageError: The gpu tag cannot be derived (the tag names no line, e.g. ``sha-1a2b3c4``
            or ``latest``) and none was given, or the given gpu tag is not a CUDA build.
    """
    image = config.deployment.image
    match = _TAG_LINE.match(image.tag)
    is_cuda = bool(CUDA_TAG.search(image.tag))
    cpu_tag = f"{match['version']}-cpu" if match and is_cuda else image.tag
    if gpu_tag is None:
        if is_cuda:
            gpu_tag = image.tag
        elif match:
            gpu_tag = f"{match['version']}-{DEFAULT_GPU_LINE}"
        else:
            raise UsageError(
                f"deployment.image.tag '{image.tag}' names no CUDA line, so the gpu profile has "
                "no image; pass --gpu-tag (e.g. --gpu-tag 0.1.0-cu126) or use a "
                "'<version>-cpu' tag."
            )
    elif not CUDA_TAG.search(gpu_tag):
        raise UsageError(
            f"--gpu-tag '{gpu_tag}' is not a CUDA build; use a tag such as '0.1.0-cu126'."
        )
    return {"cpu": f"{image.repository}:{cpu_tag}", "gpu": f"{image.repository}:{gpu_tag}"}


# ---------------------------------------------------------------------------- quantities
def compose_cpus(quantity: str) -> str:
    """Kubernetes CPU quantity as Compose ``cpus``: ``"500m"`` -> ``"0.5"``, ``"2"`` -> ``"2"``.

    Args:
        quantity: CPU cores as a Kubernetes quantity (``deployment.resources.*.cpu``).

    Returns:
        Cores as a decimal string.
    """
    return format(cpu_cores(quantity).normalize(), "f")


def compose_memory(quantity: str) -> str:
    """Kubernetes memory quantity as a Compose byte value (Docker's units are binary).

    ``"1Gi"`` -> ``"1g"``, ``"256Mi"`` -> ``"256m"``, ``"1G"`` -> ``"1000000000b"``.

    Args:
        quantity: Bytes as a Kubernetes quantity (``deployment.resources.*.memory``).

    Returns:
        Bytes with the largest exact Docker unit (``g``, ``m``, ``k``) or ``b``.
    """
    match = re.fullmatch(r"(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<unit>[KMGT]i?)?", quantity)
    if match is None:
        raise ValueError(quantity)  # the schema's pattern already refused it
    unit = match["unit"] or ""
    scale = _BINARY.get(unit) or _DECIMAL.get(unit) or 1
    size = math.ceil(Decimal(match["number"]) * scale)
    for suffix, factor in (("g", 2**30), ("m", 2**20), ("k", 2**10)):
        if size % factor == 0:
            return f"{size // factor}{suffix}"
    return f"{size}b"


# ------------------------------------------------------------------------------ services
def participant_service(participant_id: str, profile: str) -> str:
    """Compose service name of one participant in one profile (``participant-<id>[-gpu]``)."""
    suffix = "" if profile == "cpu" else f"-{profile}"
    return f"participant-{participant_id}{suffix}"


def participant_network(participant_id: str) -> str:
    """Name of the network one participant shares only with the coordinator."""
    return f"net-{participant_id}"


def participant_volume(participant_id: str) -> str:
    """Name of the volume that holds one participant's private data."""
    return f"data-{participant_id}"


def gpu_devices(pod: RankPod) -> int:
    """GPUs a participant's gpu-profile container reserves: at least one, and one per rank."""
    return max(1, pod.gpus, pod.ranks_per_pod)


def _relative_dir(path: str) -> str:
    """A bind source as Compose wants it: relative paths start with ``./``."""
    posix = PurePosixPath(path)
    if posix.is_absolute() or path.startswith(("./", "../")):
        return str(posix)
    return f"./{posix}"


def _resources(cpu: str, memory: str, gpus: int) -> dict[str, Any]:
    resources: dict[str, Any] = {
        "limits": {"cpus": compose_cpus(cpu), "memory": compose_memory(memory)}
    }
    if gpus > 0:
        resources["reservations"] = {
            "devices": [{"driver": "nvidia", "count": gpus, "capabilities": ["gpu"]}]
        }
    return resources


def _mounts(
    config: LensembleConfig, *, identity: str, state: str, certs_dir: str, config_name: str
) -> list[dict[str, Any]]:
    """The config (read-only), the identity's own TLS folder when TLS is on, and its state."""
    mounts: list[dict[str, Any]] = [
        {
            "type": "bind",
            "source": _relative_dir(config_name),
            "target": CONFIG_PATH,
            "read_only": True,
        }
    ]
    if config.network.tls.enabled:
        mounts.append(
            {
                "type": "bind",
                "source": f"{_relative_dir(certs_dir)}/{identity}",
                "target": TLS_DIR,
                "read_only": True,
            }
        )
    mounts.append({"type": "volume", "source": state, "target": STATE_DIR})
    return mounts


@dataclass(frozen=True)
class _Placement:
    """What one container holds and uses: state volume, networks, CPU and memory quantities."""

    state: str
    networks: list[str]
    cpu: str
    memory: str


def _placement(
    config: LensembleConfig, participant: ParticipantSpec | None, ranks: RankPod | None
) -> _Placement:
    if participant is None:
        own = config.deployment.resources.coordinator
        networks = [participant_network(pid) for pid in config.participant_ids]
        return _Placement(COORDINATOR_VOLUME, networks, own.cpu, own.memory)
    pod = ranks if ranks is not None else rank_pod(config, participant.id)
    networks = [participant_network(participant.id)]
    return _Placement(participant_volume(participant.id), networks, pod.cpu, pod.memory)


def _healthcheck(config: LensembleConfig) -> dict[str, Any]:
    return {
        "test": ["CMD", "lensemble", "health", "--port", str(config.network.health_port)],
        "interval": HEALTH_INTERVAL,
        "timeout": HEALTH_TIMEOUT,
        "retries": HEALTH_RETRIES,
        "start_period": HEALTH_START_PERIOD,
    }


def _service(
    config: LensembleConfig,
    *,
    identity: str,
    participant: ParticipantSpec | None,
    ranks: RankPod | None = None,
    image: str,
    profiles: list[str],
    gpus: int,
    certs_dir: str,
    config_name: str,
) -> dict[str, Any]:
    """One container of the stack; ``participant`` (and ``ranks``) is None for the coordinator."""
    role = "coordinator" if participant is None else "participant"
    environment = {"LENSEMBLE_ROLE": role, "LENSEMBLE_CONFIG": CONFIG_PATH}
    labels = {LABEL_RUN: config.run.name, LABEL_ROLE: role}
    if participant is not None:
        environment["LENSEMBLE_PARTICIPANT_ID"] = participant.id
        labels[LABEL_PARTICIPANT] = participant.id
        labels[LABEL_TRUST_DOMAIN] = participant.trust_domain
    labels[LABEL_PROFILE] = ",".join(profiles)
    place = _placement(config, participant, ranks)
    mounts = _mounts(
        config, identity=identity, state=place.state, certs_dir=certs_dir, config_name=config_name
    )
    service: dict[str, Any] = {
        "image": image,
        "pull_policy": PULL_POLICY[config.deployment.image.pull_policy],
        "profiles": profiles,
        "command": ["serve"],
        "environment": environment,
        "user": IMAGE_USER,
        "read_only": True,
        "tmpfs": [SCRATCH_DIR],
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
        "ulimits": {"nofile": {"soft": NOFILE, "hard": NOFILE}},
        # tini as PID 1 forwards SIGTERM and reaps children.
        "init": True,
        "volumes": mounts,
        "networks": place.networks,
    }
    if ranks is not None and ranks.multi_rank:
        # torch.distributed moves tensors between local ranks through /dev/shm (64 MiB default).
        service["shm_size"] = f"{ranks.shm_mib}m"
        labels[LABEL_RANKS] = str(ranks.world_size)
    if participant is not None:
        service["depends_on"] = {COORDINATOR: {"condition": "service_healthy"}}
    grace_s = math.ceil(config.network.rpc_timeout_s) + STOP_GRACE_MARGIN_S
    service.update(
        {
            "healthcheck": _healthcheck(config),
            "restart": RESTART_POLICY,
            "stop_signal": "SIGTERM",
            "stop_grace_period": f"{grace_s}s",
            "deploy": {"resources": _resources(place.cpu, place.memory, gpus)},
            "labels": labels,
        }
    )
    return service


def _services(
    config: LensembleConfig, images: dict[str, str], *, certs_dir: str, config_name: str
) -> dict[str, Any]:
    """The coordinator, every participant in each profile, and Prometheus."""
    coordinator_gpus = config.deployment.resources.coordinator.gpu
    # The coordinator only averages; it runs the CPU image unless the config gives it GPUs.
    own = config.deployment.image
    services: dict[str, Any] = {
        COORDINATOR: _service(
            config,
            identity=COORDINATOR,
            participant=None,
            image=f"{own.repository}:{own.tag}" if coordinator_gpus else images["cpu"],
            profiles=list(PROFILES),
            gpus=coordinator_gpus,
            certs_dir=certs_dir,
            config_name=config_name,
        )
    }
    by_id = {p.id: p for p in config.federation.participants}
    for profile in PROFILES:
        for pid in config.participant_ids:
            pod = rank_pod(config, pid)
            services[participant_service(pid, profile)] = _service(
                config,
                identity=pid,
                participant=by_id[pid],
                ranks=pod,
                image=images[profile],
                profiles=[profile],
                gpus=gpu_devices(pod) if profile == "gpu" else 0,
                certs_dir=certs_dir,
                config_name=config_name,
            )
    services[PROMETHEUS] = prometheus_service(
        [participant_network(pid) for pid in config.participant_ids]
    )
    services[PROMETHEUS]["labels"] = {LABEL_RUN: config.run.name, LABEL_ROLE: PROMETHEUS}
    return services


def _participant_labels(config: LensembleConfig) -> dict[str, dict[str, str]]:
    """Labels of each participant's network and volume, by participant id."""
    by_id = {p.id: p for p in config.federation.participants}
    return {
        pid: {
            LABEL_RUN: config.run.name,
            LABEL_PARTICIPANT: pid,
            LABEL_TRUST_DOMAIN: by_id[pid].trust_domain,
        }
        for pid in config.participant_ids
    }


def _networks(config: LensembleConfig) -> dict[str, Any]:
    networks: dict[str, Any] = {
        # No route out: a participant talks to the coordinator and nothing else.
        participant_network(pid): {"internal": True, "labels": labels}
        for pid, labels in _participant_labels(config).items()
    }
    # Prometheus's own network: the only one with a route to the host (its published port).
    networks[MONITORING_NETWORK] = {"labels": {LABEL_RUN: config.run.name, LABEL_ROLE: PROMETHEUS}}
    return networks


def _named_volumes(config: LensembleConfig) -> dict[str, Any]:
    volumes: dict[str, Any] = {
        COORDINATOR_VOLUME: {"labels": {LABEL_RUN: config.run.name, LABEL_ROLE: COORDINATOR}}
    }
    for pid, labels in _participant_labels(config).items():
        volumes[participant_volume(pid)] = {"labels": labels}
    return volumes


def render_compose(
    config: LensembleConfig,
    *,
    certs_dir: str = "certs",
    gpu_tag: str | None = None,
    config_name: str = CONTAINER_CONFIG_NAME,
) -> dict[str, Any]:
    """Render the Compose file of a config as a mapping (see the module docstring).

    Args:
        config: The validated source config; ``federation.transport`` must be ``network``.
        certs_dir: Folder ``lensemble certs init`` fills, relative to the Compose file's folder
            (or absolute); each service mounts its own ``<certs_dir>/<identity>`` folder.
        gpu_tag: Image tag of the gpu profile; None derives it (see :func:`profile_images`).
        config_name: Container config file, relative to the Compose file's folder.

    Returns:
        The Compose mapping (services, networks, volumes and an ``x-lensemble`` block with the
        run name, used as project name, and the config hash).

    Raises:
        ConfigError: The config cannot run on Compose (see :func:`check_composable`).
        UsageError: The gpu profile's image cannot be derived (see :func:`profile_images`).
    """
    check_composable(config)
    images = profile_images(config, gpu_tag)
    return {
        "x-lensemble": {
            "project": config.run.name,
            "config_hash": config_hash(config),
            "container_config": config_name,
            "certs": certs_dir,
        },
        "services": _services(config, images, certs_dir=certs_dir, config_name=config_name),
        "networks": _networks(config),
        "volumes": _named_volumes(config),
    }
