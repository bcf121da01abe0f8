"""The Compose renderer: topology, the container config and its hash, images, errors, CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lensemble.config import LensembleConfig, config_hash, differing_fields, load_config
from lensemble.errors import ConfigError, UsageError
from lensemble.render.compose import (
    compose_container_config,
    compose_cpus,
    compose_memory,
    profile_images,
    render_compose,
)
from lensemble.render.compose_files import write_compose
from tests.compose.conftest import REPO
from tests.compose.topology import assert_topology, in_profile
from tests.support.cli import run_cli

LOCAL_NETWORK = ["federation.transport=network"]


def local(*extra: str) -> LensembleConfig:
    return load_config(REPO / "config/local.yaml", [*LOCAL_NETWORK, *extra])


def test_topology_of_every_environment(env_config: tuple[str, LensembleConfig]) -> None:
    _, cfg = env_config
    assert_topology(render_compose(cfg), cfg)


@pytest.mark.parametrize("count", [1, 2, 7])
def test_participant_count_sets_the_number_of_participant_services(count: int) -> None:
    cfg = load_config(
        REPO / "config/staging.yaml",
        [f"federation.participant_count={count}", "federation.quorum=1"],
    )
    compose = render_compose(cfg)
    assert_topology(compose, cfg)
    assert len(in_profile(compose, "cpu")) == count + 1


def test_container_config_keeps_the_config_hash(env_config: tuple[str, LensembleConfig]) -> None:
    _, cfg = env_config
    inside = compose_container_config(cfg)
    assert config_hash(inside) == config_hash(cfg)
    # Only the container-specific fields change.
    allowed = {
        "run.output_dir",
        "network.host",
        "network.listen_host",
        "network.tls.ca_file",
        "network.tls.cert_file",
        "network.tls.key_file",
        "observability.log_format",
    }
    assert set(differing_fields(cfg, inside, hashed_only=False)) <= allowed
    assert inside.network.host == "coordinator"
    assert inside.network.listen_host == "0.0.0.0"
    assert inside.run.output_dir == "/var/lib/lensemble"
    assert inside.observability.log_format == "json"
    assert inside.network.tls.cert_file == "/etc/lensemble/tls/tls.crt"


def test_written_container_config_loads_with_the_source_hash(
    env_config: tuple[str, LensembleConfig], tmp_path: Path
) -> None:
    _, cfg = env_config
    files = write_compose(cfg, tmp_path / "stack" / "compose.yaml")
    assert files.config == tmp_path / "stack" / "lensemble.yaml"
    assert config_hash(load_config(files.config)) == config_hash(cfg)
    compose = yaml.safe_load(files.compose.read_text(encoding="utf-8"))
    assert compose == render_compose(cfg)
    mounted = {
        v["source"]
        for s in compose["services"].values()
        for v in s["volumes"]
        if v["target"] == "/etc/lensemble/config.yaml"
    }
    assert mounted == {"./lensemble.yaml"}


@pytest.mark.parametrize("download_port", ["50061", "null"])
def test_the_download_port_reaches_the_containers_through_their_config(
    download_port: str,
) -> None:
    """Compose carries no coordinator port: a participant dials ``network.host`` on its internal
    network at the ports of the config every container mounts, the model download's too."""
    cfg = local(f"network.download_port={download_port}")
    compose = render_compose(cfg)
    assert_topology(compose, cfg)
    inside = compose_container_config(cfg)
    expected = None if download_port == "null" else int(download_port)
    assert inside.network.download_port == cfg.network.download_port == expected
    assert inside.network.host == "coordinator"
    assert compose == render_compose(local())


def test_without_tls_nothing_is_mounted_at_the_tls_path() -> None:
    cfg = local(
        "network.auth=insecure", "network.tls.enabled=false", "network.tls.client_auth=false"
    )
    compose = render_compose(cfg)
    assert_topology(compose, cfg)
    # TLS is off, so its paths are left as they were.
    assert compose_container_config(cfg).network.tls == cfg.network.tls


def test_gpu_profile_reserves_gpus_and_uses_a_cuda_image() -> None:
    compose = render_compose(local())
    gpu = in_profile(compose, "gpu")
    assert gpu["participant-alpine-gpu"]["image"] == "lensemble:0.1.0-cu126"
    devices = gpu["participant-alpine-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    cpu = in_profile(compose, "cpu")
    assert cpu["participant-alpine"]["image"] == "lensemble:0.1.0-cpu"
    assert "reservations" not in cpu["participant-alpine"]["deploy"]["resources"]
    # The coordinator only averages: the CPU image, no GPU, in both profiles.
    assert compose["services"]["coordinator"]["image"] == "lensemble:0.1.0-cpu"
    assert compose["services"]["coordinator"]["profiles"] == ["cpu", "gpu"]


def test_gpu_counts_and_cuda_tag_come_from_the_config() -> None:
    cfg = local("deployment.image.tag=0.2.0-cu128", "deployment.resources.participant.gpu=2")
    compose = render_compose(cfg)
    gpu = compose["services"]["participant-delta-gpu"]
    assert gpu["image"] == "lensemble:0.2.0-cu128"
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 2
    assert compose["services"]["participant-delta"]["image"] == "lensemble:0.2.0-cpu"


@pytest.mark.parametrize(
    ("tag", "gpu_tag", "expected"),
    [
        ("0.1.0-cpu", None, ("0.1.0-cpu", "0.1.0-cu126")),
        ("0.1.0-cu128", None, ("0.1.0-cpu", "0.1.0-cu128")),
        ("sha-1a2b3c4", "sha-9f8e7d6-cu126", ("sha-1a2b3c4", "sha-9f8e7d6-cu126")),
    ],
)
def test_profile_images(tag: str, gpu_tag: str | None, expected: tuple[str, str]) -> None:
    images = profile_images(local(f"deployment.image.tag={tag}"), gpu_tag)
    assert images == {"cpu": f"lensemble:{expected[0]}", "gpu": f"lensemble:{expected[1]}"}


@pytest.mark.parametrize(("tag", "gpu_tag"), [("sha-1a2b3c4", None), ("0.1.0-cpu", "0.1.0-cpu")])
def test_gpu_image_that_cannot_be_a_cuda_build_is_refused(tag: str, gpu_tag: str | None) -> None:
    with pytest.raises(UsageError, match="gpu"):
        profile_images(local(f"deployment.image.tag={tag}"), gpu_tag)


def test_in_process_transport_is_refused_with_the_fix() -> None:
    cfg = load_config(REPO / "config/local.yaml")
    with pytest.raises(ConfigError) as info:
        render_compose(cfg)
    assert [p.path for p in info.value.problems] == ["federation.transport"]
    assert "--set federation.transport=network" in str(info.value)


def test_token_auth_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"network\.auth"):
        render_compose(local("network.auth=token"))


def test_masking_renders_with_the_runs_one_ca_in_every_container() -> None:
    compose = render_compose(local("federation.aggregation=masking"))
    assert set(compose["services"]) >= {"coordinator", "participant-alpine"}


def test_participant_id_colliding_with_a_gpu_service_is_refused() -> None:
    cfg = local("federation.participants[1].id=alpine-gpu")
    with pytest.raises(ConfigError) as info:
        render_compose(cfg)
    assert info.value.problems[0].path == "federation.participants[1].id"


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [("500m", "0.5"), ("2", "2"), ("1.5", "1.5"), ("250m", "0.25"), ("100", "100")],
)
def test_compose_cpus(quantity: str, expected: str) -> None:
    assert compose_cpus(quantity) == expected


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [
        ("1Gi", "1g"),
        ("256Mi", "256m"),
        ("1.5Gi", "1536m"),
        ("64Ki", "64k"),
        ("1G", "1000000000b"),
        ("512M", "500000k"),
        ("1000", "1000b"),
        ("2Ti", "2048g"),
    ],
)
def test_compose_memory(quantity: str, expected: str) -> None:
    assert compose_memory(quantity) == expected


def test_cli_writes_both_files_and_quotes_the_regenerate_command(tmp_path: Path) -> None:
    out = tmp_path / "compose.yaml"
    result = run_cli(
        "render",
        "compose",
        "--config",
        str(REPO / "config/local.yaml"),
        "--set",
        "federation.transport=network",
        "-o",
        str(out),
    )
    assert result.code == 0, result.err
    text = out.read_text(encoding="utf-8")
    assert (
        f"lensemble render compose --config {REPO / 'config/local.yaml'} --set federation.transport=network -o {out}"
        in text
    )
    assert (tmp_path / "lensemble.yaml").is_file()
    assert "wrote" in result.err  # status on stderr (issue 41, item 3)


def test_cli_prints_to_stdout_without_output(in_repo: Path) -> None:
    result = run_cli("render", "compose", "--config", "config/staging.yaml")
    assert result.code == 0, result.err
    compose = yaml.safe_load(result.out)
    assert "coordinator" in compose["services"]
    assert "lensemble.yaml" in result.err


def test_cli_reports_an_in_process_config_in_one_line(in_repo: Path) -> None:
    result = run_cli("render", "compose", "--config", "config/local.yaml")
    assert result.code == 2
    assert result.err.count("\n") == 1
    assert "federation.transport" in result.err
    assert "Traceback" not in result.err
