"""``lensemble image base`` / ``image build`` logic without an engine: client choice, the staged
context and its digest, the build command, the base's mirror and commands, error sentences."""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path
from typing import Any

import pytest

from lensemble.errors import ToolMissing, UsageError
from lensemble.image import CONTEXT_DIGEST_LABEL
from lensemble.image.build import (
    build_command,
    context_digest,
    explain_failure,
    find_source_tree,
    stage_context,
)
from lensemble.image.client import BuildClient, client_major, find_build_client, probe_client
from lensemble.image.debian_base import (
    host_debian_mirror,
    import_command,
    mmdebstrap_command,
    snapshot_epoch,
)
from tests.conftest import REPO
from tests.support.cli import run_cli


# ------------------------------------------------------------------------------ the client
class Clients:
    """A stand-in for `subprocess.run`: each docker executable with its version and buildx."""

    def __init__(self, versions: dict[str, str], buildx: set[str]) -> None:
        self.versions = versions
        self.buildx = buildx

    def __call__(self, args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        docker = args[0]
        if args[1:3] == ["buildx", "version"]:
            code = 0 if docker in self.buildx else 1
            return subprocess.CompletedProcess(args, code, "", "")
        return subprocess.CompletedProcess(args, 0, self.versions[docker] + "\n", "")


def test_a_newer_client_without_buildx_is_passed_over_for_an_older_one_with_buildkit() -> None:
    run = Clients({"/usr/local/bin/docker": "28.2.2", "/usr/bin/docker": "20.10.24+dfsg1"}, set())
    assert probe_client("/usr/local/bin/docker", run) is None
    client = probe_client("/usr/bin/docker", run)
    assert client == BuildClient(
        docker="/usr/bin/docker", build=["/usr/bin/docker", "build"], env={"DOCKER_BUILDKIT": "1"}
    )


def test_buildx_wins_whatever_the_version() -> None:
    run = Clients({"/x/docker": "28.2.2"}, {"/x/docker"})
    assert find_build_client("/x/docker", run=run).build == [
        "/x/docker",
        "buildx",
        "build",
        "--load",
    ]


def test_no_buildkit_client_is_one_sentence_with_the_fix() -> None:
    run = Clients({"/x/docker": "28.2.2"}, set())
    with pytest.raises(ToolMissing) as info:
        find_build_client("/x/docker", run=run)
    assert "No docker client here can build with BuildKit (/x/docker" in str(info.value)
    assert "docker-buildx" in info.value.remediation
    with pytest.raises(ToolMissing, match="not installed"):
        find_build_client(None, run=run, path="/nonexistent")


@pytest.mark.parametrize(
    ("text", "major"), [("20.10.24+dfsg1", 20), ("28.2.2", 28), ("", None), ("dev", None)]
)
def test_client_major(text: str, major: int | None) -> None:
    assert client_major(text) == major


# ---------------------------------------------------------------------------- the context
def test_the_staged_context_holds_only_what_the_image_needs(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl").write_bytes(b"wheel")
    (wheels / "notes.txt").write_text("not a wheel")
    staged = tmp_path / "ctx"
    staged.mkdir()
    stage_context(REPO, staged, wheels)
    top = sorted(p.name for p in staged.iterdir())
    assert top == [
        "Dockerfile",
        "README.md",
        "constraints.txt",
        "image",
        "pyproject.toml",
        "runtime",
        "wheelhouse",
    ]
    assert [p.name for p in (staged / "image").rglob("*") if p.is_file()] == ["pip"]
    assert [p.name for p in (staged / "wheelhouse").iterdir()] == [
        "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"
    ]
    files = [p for p in staged.rglob("*") if p.is_file()]
    assert not [p for p in files if "__pycache__" in p.parts or p.suffix == ".pyc"]
    assert not [p for p in files if p.suffix in (".key", ".pem", ".crt")]
    assert (staged / "runtime/lensemble/__init__.py").is_file()


def test_the_context_digest_follows_the_content_and_ignores_bytecode(tmp_path: Path) -> None:
    tree = tmp_path / "src"
    for name in (
        "Dockerfile",
        "pyproject.toml",
        "README.md",
        "constraints.txt",
        "image/pip",
    ):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(name)
    (tree / "runtime/lensemble").mkdir(parents=True)
    (tree / "runtime/lensemble/__init__.py").write_text("x = 1\n")
    first = context_digest(tree)
    assert first.startswith("sha256:") and len(first) == 7 + 64
    (tree / "runtime/lensemble/__pycache__").mkdir()
    (tree / "runtime/lensemble/__pycache__/x.cpython-311.pyc").write_bytes(b"\0")
    (tree / "runtime/lensemble.egg-info").mkdir()
    (tree / "runtime/lensemble.egg-info/PKG-INFO").write_text("local install")
    assert context_digest(tree) == first
    (tree / "runtime/lensemble/__init__.py").write_text("x = 2\n")
    assert context_digest(tree) != first


def test_an_empty_wheelhouse_and_an_incomplete_tree_are_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "ctx").mkdir()
    with pytest.raises(UsageError, match="not a folder holding wheels"):
        stage_context(REPO, tmp_path / "ctx", tmp_path / "empty")
    with pytest.raises(UsageError, match="not inside a Lensemble source checkout"):
        find_source_tree(tmp_path)
    assert find_source_tree(REPO / "runtime" / "lensemble") == REPO


def test_the_build_command_passes_secrets_as_secrets_and_labels_the_digest(tmp_path: Path) -> None:
    client = BuildClient("/usr/bin/docker", ["/usr/bin/docker", "build"], {"DOCKER_BUILDKIT": "1"})
    args = build_command(
        client,
        tmp_path,
        tags=["lensemble:0.1.0-cpu", "lensemble:sha-abcdef1"],
        base="lensemble-base:bookworm",
        torch_cuda="cpu",
        version="0.1.0",
        revision="abcdef1234",
        digest="sha256:00",
        ca_bundle=Path("/etc/ssl/certs/ca-certificates.crt"),
        pip_index_url=None,
        torch_index_url=None,
    )
    assert args[:3] == ["/usr/bin/docker", "build", "--progress=plain"]
    assert args[-1] == str(tmp_path)
    pairs = list(itertools.pairwise(args))
    assert ("--secret", "id=ca-bundle,src=/etc/ssl/certs/ca-certificates.crt") in pairs
    assert ("--build-arg", "BASE_IMAGE=lensemble-base:bookworm") in pairs
    assert ("--label", f"{CONTEXT_DIGEST_LABEL}=sha256:00") in pairs
    assert ("--tag", "lensemble:sha-abcdef1") in pairs
    # The CA bundle never travels as a build argument (those are visible in the history).
    assert not [a for a in args if a.startswith("--build-arg") and "ca" in a.lower()]
    assert not any("PIP_INDEX_URL" in a for a in args)


@pytest.mark.parametrize(
    ("tail", "needle"),
    [
        (
            [
                "#3 ERROR: failed to do request: Head https://registry-1.docker.io/v2/: dial tcp",
                "failed to solve: failed to resolve source metadata for python:3.11",
            ],
            "could not fetch the base image",
        ),
        (
            ["SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED]"],
            "TLS certificate",
        ),
        (["#12 ERROR: process did not complete successfully: exit code: 2"], "exit code: 2"),
        (
            [
                "#10 9.12 ERROR: Could not install packages due to an OSError: [Errno 28] No "
                "space left on device",
                "#10 ERROR: executor failed running [/bin/sh -c set -eu; pip install]: exit code: 1",
            ],
            "disk the Docker engine writes to is full: #10 9.12 ERROR: Could not install",
        ),
        (
            [
                "#10 4.0 WARNING: Retrying (Retry(total=0)) after connection broken by "
                "'NewConnectionError(Temporary failure in name resolution)'",
                "#10 5.1 ERROR: Could not find a version that satisfies the requirement sympy",
                "#10 ERROR: executor failed running [/bin/sh -c pip install]: exit code: 1",
            ],
            "could not reach the package index: #10 5.1 ERROR: Could not find a version",
        ),
    ],
)
def test_build_failures_are_explained(tail: list[str], needle: str) -> None:
    message, remediation = explain_failure(tail, "python:3.11")
    assert needle in message
    assert remediation


# ------------------------------------------------------------------------------- the base
def test_the_host_mirror_comes_from_deb822_and_one_line_sources(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d/debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm\n"
    )
    assert host_debian_mirror(tmp_path / "none", tmp_path / "d") == "http://mirror.example/debian"
    (tmp_path / "sources.list").write_text(
        "# comment\ndeb [signed-by=/k.gpg] http://other.example/debian bookworm main\n"
    )
    assert host_debian_mirror(tmp_path / "sources.list", tmp_path / "d") == (
        "http://other.example/debian"
    )
    assert host_debian_mirror(tmp_path / "none", tmp_path / "nodir") is None


def test_the_base_commands_pin_the_suite_and_keep_docs_out() -> None:
    args = mmdebstrap_command("bookworm", "http://m/debian")
    assert args[-3:] == ["bookworm", "-", "http://m/debian"]
    assert "--include=python3,python3-venv,ca-certificates,passwd" in args
    assert "--dpkgopt=path-exclude=/usr/share/doc/*" in args
    assert "--dpkgopt=path-include=/usr/share/doc/*/copyright" in args
    snap = mmdebstrap_command("bookworm", "http://s/", snapshot="20250520T000000Z")
    assert "--aptopt=Acquire::Check-Valid-Until false" in snap
    imported = import_command("docker", "lensemble-base:bookworm", "bookworm", "http://m/debian")
    assert imported[-2:] == ["-", "lensemble-base:bookworm"]


def test_snapshot_timestamps() -> None:
    assert snapshot_epoch("20250520T000000Z") == 1747699200
    with pytest.raises(UsageError, match="YYYYMMDDTHHMMSSZ"):
        snapshot_epoch("2025-05-20")


def test_cli_image_build_outside_a_checkout_is_one_sentence(tmp_path: Path) -> None:
    result = run_cli("image", "build", "--context", str(tmp_path))
    assert result.code == 2, result.err
    assert result.err.startswith("error: ") and "Traceback" not in result.err
    assert "not inside a Lensemble source checkout" in result.err
