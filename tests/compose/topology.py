"""Topology assertions shared by the render tests and the real-Compose validation tests.

They accept both our rendered mapping and the normalised output of ``docker-compose config``
(where ``networks`` of a service is a mapping and bind sources are absolute).
"""

from __future__ import annotations

from typing import Any

from lensemble.config import LensembleConfig
from lensemble.render.compose import compose_cpus, compose_memory
from lensemble.render.ranks import rank_pod

PROFILES = ("cpu", "gpu")


def networks_of(service: dict[str, Any]) -> set[str]:
    # A list in our rendering, a mapping in docker-compose's normalised output: keys either way.
    return set(service.get("networks") or ())


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def in_profile(compose: dict[str, Any], profile: str) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items() if profile in s.get("profiles", [])}


def assert_topology(compose: dict[str, Any], cfg: LensembleConfig) -> None:
    """Every property the issue asks of the Compose topology, for both profiles."""
    ids = set(cfg.participant_ids)
    n = len(ids)
    services = dict(compose["services"])
    assert set(compose.get("volumes", {})) == {"coordinator-state"} | {f"data-{p}" for p in ids}
    assert set(compose.get("networks", {})) == {f"net-{p}" for p in ids} | {"monitoring"}
    # Every service belongs to a profile: nothing starts without choosing cpu or gpu.
    assert all(s.get("profiles") for s in services.values())
    for profile in PROFILES:
        active = in_profile(compose, profile)
        # Service count = participants + 1 in each profile.
        assert len(active) == n + 1, (profile, sorted(active))
        coordinators = [
            k for k, s in active.items() if env_of(s)["LENSEMBLE_ROLE"] == "coordinator"
        ]
        assert coordinators == ["coordinator"]
        participants = {k: s for k, s in active.items() if k != "coordinator"}
        assert {env_of(s)["LENSEMBLE_ROLE"] for s in participants.values()} == {"participant"}
        assert {env_of(s)["LENSEMBLE_PARTICIPANT_ID"] for s in participants.values()} == ids
        # Each data volume is mounted by exactly one participant, and by nothing else.
        for pid in ids:
            mounts = [
                name
                for name, s in active.items()
                for v in s["volumes"]
                if v["type"] == "volume" and v["source"] == f"data-{pid}"
            ]
            assert len(mounts) == 1, (profile, pid, mounts)
            assert env_of(active[mounts[0]]).get("LENSEMBLE_PARTICIPANT_ID") == pid
        # No participant on another participant's network; the coordinator on all of them.
        assert networks_of(active["coordinator"]) == {f"net-{p}" for p in ids}
        for s in participants.values():
            assert networks_of(s) == {f"net-{env_of(s)['LENSEMBLE_PARTICIPANT_ID']}"}
        for name, s in participants.items():
            assert s["depends_on"] == {"coordinator": {"condition": "service_healthy"}}, name
        gpu_services = [k for k, s in participants.items() if _gpu_devices(s)]
        assert gpu_services == (sorted(participants) if profile == "gpu" else []), profile
    for name, net in compose["networks"].items():
        # Only Prometheus's own network has a route out (its published port, on loopback).
        assert bool(net.get("internal")) is (name != "monitoring"), name
    assert_monitoring(services.pop("prometheus"), ids)
    coordinator = services["coordinator"]
    test = coordinator["healthcheck"]["test"]
    assert test[:3] == ["CMD", "lensemble", "health"]
    assert test[test.index("--port") + 1] == str(cfg.network.health_port)
    assert "coordinator-state" in {
        v["source"] for v in coordinator["volumes"] if v["type"] == "volume"
    }
    for name, s in services.items():
        assert_hardened(name, s, cfg)
        # The coordinator's gRPC and model download ports are reached over the participants'
        # internal networks alone: no service publishes or exposes a port.
        assert "ports" not in s and "expose" not in s, name


def assert_monitoring(service: dict[str, Any], ids: set[str]) -> None:
    """Prometheus: only in the monitoring profile, read-only, scraping every participant."""
    assert service["profiles"] == ["monitoring"]
    assert networks_of(service) == {"monitoring"} | {f"net-{p}" for p in ids}
    assert service["read_only"] is True and service["cap_drop"] == ["ALL"]
    assert int(str(service["user"]).split(":")[0]) != 0
    assert all(v["type"] == "bind" and v["read_only"] is True for v in service["volumes"])
    assert all(str(port).startswith("127.0.0.1:") for port in service["ports"])


def _gpu_devices(service: dict[str, Any]) -> list[dict[str, Any]]:
    reservations = service.get("deploy", {}).get("resources", {}).get("reservations", {})
    devices = reservations.get("devices", [])
    for device in devices:
        assert device["capabilities"] == ["gpu"]
        assert int(device["count"]) >= 1
    return list(devices)


def assert_hardened(name: str, service: dict[str, Any], cfg: LensembleConfig) -> None:
    """Read-only mounts of config and TLS, read-only root, tmpfs, non-root, limits, restart."""
    env = env_of(service)
    identity = env.get("LENSEMBLE_PARTICIPANT_ID", "coordinator")
    binds = [v for v in service["volumes"] if v["type"] == "bind"]
    assert all(v.get("read_only") is True for v in binds), name
    targets = {v["target"]: v for v in binds}
    assert "/etc/lensemble/config.yaml" in targets, name
    if cfg.network.tls.enabled:
        tls = targets["/etc/lensemble/tls"]
        # Only this identity's folder: never the CA key, never another identity's key.
        assert tls["source"].rstrip("/").endswith(f"/{identity}"), (name, tls["source"])
    else:
        assert "/etc/lensemble/tls" not in targets
    writable = [v["target"] for v in service["volumes"] if v["type"] == "volume"]
    assert writable == ["/var/lib/lensemble"], name
    assert service["read_only"] is True
    assert "/tmp" in service["tmpfs"]
    uid = str(service["user"]).split(":")[0]
    assert uid.isdigit() and int(uid) != 0, name
    assert service["restart"].startswith("on-failure")
    assert service["stop_signal"] == "SIGTERM"
    # A participant's container holds all its ranks: per-rank CPU and memory times the ranks.
    if identity == "coordinator":
        cpu, memory = (
            cfg.deployment.resources.coordinator.cpu,
            cfg.deployment.resources.coordinator.memory,
        )
    else:
        pod = rank_pod(cfg, identity)
        cpu, memory = pod.cpu, pod.memory
    limits = service["deploy"]["resources"]["limits"]
    assert float(limits["cpus"]) == float(compose_cpus(cpu))
    assert limits["memory"] == compose_memory(memory)
