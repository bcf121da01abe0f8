"""The image contract, checked on the built image (docs/architecture.md, "One image").

Runs as UID 10001 with a read-only root filesystem and no capabilities; answers ``--version``
and ``config validate``; its own HEALTHCHECK turns healthy; and no private key, certificate of
ours, or extra CA given to the build is stored in any layer or shows in its history.
"""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lensemble import __version__
from tests.conftest import REPO
from tests.support.tools import current_image, require

pytestmark = [pytest.mark.docker, pytest.mark.slow]

LOCKED = [
    "--read-only",
    "--tmpfs",
    "/tmp",
    "--cap-drop",
    "ALL",
    "--security-opt",
    "no-new-privileges",
]
#: Seconds the coordinator may take to turn healthy (start period 60 s, interval 10 s).
HEALTHY_WITHIN_S = 180.0
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
#: A PEM private key with its base64 body (code that merely names the marker does not match).
PRIVATE_KEY = re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----\r?\n[A-Za-z0-9+/=\r\n]{64,}-----END")


@pytest.fixture(autouse=True)
def _engine_and_image() -> None:
    require("docker")
    require("image")


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["docker", *args], capture_output=True, text=True, check=False, timeout=300
    )
    if check:
        assert done.returncode == 0, f"docker {' '.join(args[:3])}: {done.stderr}"
    return done


def locked(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``docker run`` of the current image, read-only, no capabilities, config/ mounted."""
    mount = ["-v", f"{REPO / 'config'}:/cfg:ro"]
    return docker("run", "--rm", *LOCKED, *mount, *args, check=check)


def test_runs_locked_down_as_the_image_user() -> None:
    image = current_image()
    assert locked(image, "--version").stdout.strip() == f"lensemble {__version__}"
    ids = locked("--entrypoint", "id", image).stdout.split()
    assert ids[:2] == ["uid=10001(lensemble)", "gid=10001(lensemble)"]
    assert "staging.yaml" in locked(image, "config", "validate", "/cfg/staging.yaml").stdout
    bad = locked(image, "config", "validate", "/cfg/missing.yaml", check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    # torch imports and trains under the locked-down settings (caches go to /tmp).
    script = (
        "import torch; m = torch.nn.Linear(2, 1); m(torch.ones(1, 2)).sum().backward(); "
        "print(torch.__version__)"
    )
    assert locked("--entrypoint", "python3", image, "-c", script).stdout.strip().startswith("2.")


def test_the_healthcheck_of_the_image_turns_healthy(tmp_path: Path) -> None:
    rendered = tmp_path / "compose.yaml"
    subprocess.run(
        [
            "lensemble",
            "render",
            "compose",
            "--config",
            "config/local.yaml",
            "--set",
            "federation.transport=network",
            "-o",
            str(rendered),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=120,
    )
    certs = tmp_path / "certs"
    subprocess.run(
        ["lensemble", "certs", "init", str(certs), "--config", str(tmp_path / "lensemble.yaml")],
        check=True,
        capture_output=True,
        timeout=120,
    )
    certs.chmod(0o700)
    for path in (certs / "coordinator").iterdir():
        path.chmod(0o644)
    (certs / "coordinator").chmod(0o755)
    name = f"lens-health-{uuid.uuid4().hex[:6]}"
    try:
        docker(
            "run",
            "-d",
            "--name",
            name,
            *LOCKED,
            "-e",
            "LENSEMBLE_ROLE=coordinator",
            "-v",
            f"{tmp_path / 'lensemble.yaml'}:/etc/lensemble/config.yaml:ro",
            "-v",
            f"{certs / 'coordinator'}:/etc/lensemble/tls:ro",
            "-v",
            f"{name}:/var/lib/lensemble",
            current_image(),
        )
        status = "starting"
        deadline = time.monotonic() + HEALTHY_WITHIN_S
        while status == "starting" and time.monotonic() < deadline:
            status = docker("inspect", "--format", "{{.State.Health.Status}}", name).stdout.strip()
            time.sleep(2)  # polling interval only; no assertion depends on it
        logs = docker("logs", name).stderr[-2000:]
        assert status == "healthy", f"health {status}; log:\n{logs}"
    finally:
        docker("rm", "-f", name, check=False)
        docker("volume", "rm", name, check=False)


def _pem_blocks(data: bytes) -> set[bytes]:
    blocks, rest = set(), data
    while b"-----BEGIN CERTIFICATE-----" in rest:
        start = rest.index(b"-----BEGIN CERTIFICATE-----")
        end = rest.find(b"-----END CERTIFICATE-----", start)
        if end < 0:
            break
        blocks.add(b"".join(rest[start:end].split()))
        rest = rest[end + 1 :]
    return blocks


def _layer_files(image: str) -> Iterator[tuple[str, int, Callable[[], bytes]]]:
    """Every regular file of every layer of ``image``: (path in the layer, bytes, reader).

    With overlay2 the layers are folders on this machine, read in place; ``docker save`` would
    first copy the whole image to the engine's temporary folder (over a GB of disk that a CI
    machine may not have). Other storage drivers fall back to the streamed ``docker save``.
    """
    info = json.loads(docker("image", "inspect", "--format", "{{json .GraphDriver}}", image).stdout)
    data = info.get("Data") or {}
    if info.get("Name") == "overlay2" and data.get("UpperDir"):
        folders = [data["UpperDir"], *filter(None, data.get("LowerDir", "").split(":"))]
        for folder in map(Path, folders):
            for path in folder.rglob("*"):
                if path.is_file() and not path.is_symlink():
                    yield str(path.relative_to(folder)), path.stat().st_size, path.read_bytes
        return
    saved = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
    assert saved.stdout is not None
    with tarfile.open(fileobj=saved.stdout, mode="r|") as outer:
        for member in outer:
            if not member.name.endswith("layer.tar"):
                continue
            layer = outer.extractfile(member)
            assert layer is not None
            with tarfile.open(fileobj=layer, mode="r|") as files:
                for item in files:
                    if item.isfile():
                        handle = files.extractfile(item)
                        yield item.name, item.size, (handle.read if handle else bytes)
    assert saved.wait(timeout=300) == 0


def test_no_key_certificate_or_extra_ca_in_any_layer_or_the_history() -> None:
    image = current_image()
    history = docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", image).stdout
    assert "BEGIN" not in history and str(HOST_CA_BUNDLE) not in history
    assert "PIP_CERT=" not in history.replace("export PIP_CERT=", "")
    # The CA certificates the host trusts beyond Debian's own store (a proxy's CA, say): the
    # build may use them, the image must not keep them.
    debian_store = docker(
        "run", "--rm", "--entrypoint", "cat", image, "/etc/ssl/certs/ca-certificates.crt"
    ).stdout.encode()
    host = HOST_CA_BUNDLE.read_bytes() if HOST_CA_BUNDLE.is_file() else b""
    extra = _pem_blocks(host) - _pem_blocks(debian_store)
    found_keys: list[str] = []
    found_extra: list[str] = []
    for name, size, read in _layer_files(image):
        if name.endswith((".key", "tls.crt", "ca.key")):
            found_keys.append(name)
        if size > 4 * 2**20:
            continue
        data = read()
        # Key files, not compiled libraries (libgnutls embeds a self-test key).
        if not data.startswith(b"\x7fELF") and PRIVATE_KEY.search(data):
            found_keys.append(name)
        if extra and b"BEGIN CERTIFICATE" in data and _pem_blocks(data) & extra:
            found_extra.append(name)
    assert found_keys == [], found_keys
    assert found_extra == [], found_extra


def test_the_image_is_labelled_for_its_sources() -> None:
    labels = docker("image", "inspect", "--format", "{{json .Config.Labels}}", current_image())
    text = labels.stdout
    assert f'"org.opencontainers.image.version":"{__version__}"' in text
    assert '"dev.lensemble.torch-cuda":"cpu"' in text
    size = int(docker("image", "inspect", "--format", "{{.Size}}", current_image()).stdout)
    assert size < int(1.3e9), f"the CPU image grew to {size / 1e9:.2f} GB"
