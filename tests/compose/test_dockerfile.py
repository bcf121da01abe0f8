"""The Dockerfile and its build context, checked statically (no engine needed).

The built image is checked on a real engine by ``tests/image/test_image_contract.py``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from dockerfile_parse import DockerfileParser

from lensemble import __version__
from tests.compose.conftest import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
IMAGE_HOW_TO = (REPO / "docs/how-to/container-image.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def dockerfile() -> DockerfileParser:
    return DockerfileParser(str(REPO / "Dockerfile"))


def instructions(parser: DockerfileParser, name: str) -> list[dict[str, Any]]:
    return [i for i in parser.structure if i["instruction"] == name]


def stages(parser: DockerfileParser) -> list[list[dict[str, Any]]]:
    """Instructions per build stage (the part after each FROM)."""
    out: list[list[dict[str, Any]]] = []
    for item in parser.structure:
        if item["instruction"] == "FROM":
            out.append([])
        elif out:
            out[-1].append(item)
    return out


def final_stage(parser: DockerfileParser, name: str) -> list[str]:
    return [i["value"] for i in stages(parser)[-1] if i["instruction"] == name]


def test_multi_stage_on_a_pinned_base(dockerfile: DockerfileParser) -> None:
    assert dockerfile.is_multistage
    # The optional wheelhouse (from scratch), the build stage and the runtime stage.
    assert len(stages(dockerfile)) == 3
    for image in dockerfile.parent_images:
        if image == "scratch":
            continue
        repository, _, tag = image.partition("@")[0].rpartition(":")
        assert repository, f"base image {image!r} has no tag; pin a version"
        assert tag != "latest"
        # A full version (major.minor.patch), not a moving 'python:3' or '3.11'.
        assert re.match(r"^\d+\.\d+\.\d+-", tag), f"base image {image!r} is not pinned to a version"


def test_runs_as_a_fixed_non_root_user(dockerfile: DockerfileParser) -> None:
    users = final_stage(dockerfile, "USER")
    assert users, "the final stage sets no USER, so it runs as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) >= 1000, users[-1]
    assert gid == "" or (gid.isdigit() and int(gid) != 0)
    created = " ".join(final_stage(dockerfile, "RUN"))
    assert f"--uid {uid}" in created


def test_entrypoint_cmd_healthcheck_stopsignal(dockerfile: DockerfileParser) -> None:
    assert [json.loads(v) for v in final_stage(dockerfile, "ENTRYPOINT")] == [["lensemble"]]
    assert [json.loads(v) for v in final_stage(dockerfile, "CMD")] == [["serve"]]
    (health,) = final_stage(dockerfile, "HEALTHCHECK")
    command = json.loads(health.split("CMD", 1)[1])
    assert command == ["lensemble", "health", "--port", "50052"]
    assert final_stage(dockerfile, "STOPSIGNAL") == ["SIGTERM"]


def test_build_args_choose_the_torch_line(dockerfile: DockerfileParser) -> None:
    args = {
        v.split("=", 1)[0]: v.split("=", 1)[1] if "=" in v else None
        for v in (i["value"] for i in instructions(dockerfile, "ARG"))
    }
    assert args["TORCH_CUDA"] == "cpu"
    assert args["TORCH_SPEC"].startswith("torch==")
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/${TORCH_CUDA}"
    runs = [i["value"] for i in instructions(dockerfile, "RUN")]
    torch_layer = [r for r in runs if '--index-url "${TORCH_INDEX_URL}"' in r]
    assert len(torch_layer) == 1, "torch is installed in one layer from its line's index"
    assert "${TORCH_SPEC}" in torch_layer[0]
    # ... or from the wheelhouse, pinned by constraints.txt, when it holds a torch wheel.
    assert "--find-links /wheelhouse -c /wheelhouse/constraints.txt" in torch_layer[0]
    # torch comes first, in its own layer, before the package and its constraints.
    assert runs.index(torch_layer[0]) < next(
        i for i, r in enumerate(runs) if "pip install -c constraints.txt '.[train,kms,dp]'" in r
    )
    # Only torch in that layer (two alternative pip commands, both for TORCH_SPEC).
    assert torch_layer[0].count("pip install") == 2
    assert torch_layer[0].count('"${TORCH_SPEC}"') == 2


def test_installs_with_the_readme_command(dockerfile: DockerfileParser) -> None:
    # The image runs a federation: the README's quick-start install ([train]), plus [kms] so a
    # sovereign-prod coordinator can sign its run record with its KMS key, and [dp] so a
    # participant can train with its own differential privacy.
    readme_commands = set(re.findall(r"pip install -c constraints\.txt \S+", README))
    assert "pip install -c constraints.txt '.[train]'" in readme_commands
    runs = " ".join(i["value"] for i in instructions(dockerfile, "RUN"))
    assert "pip install -c constraints.txt '.[train,kms,dp]'" in runs
    # For CUDA lines only, the CPU torch pin is dropped from the constraints.
    assert re.search(
        r'if \[ "\$\{TORCH_CUDA\}" != "cpu" \]; then sed -i \'/\^torch==/d\' constraints\.txt', runs
    )
    torch_pin = [
        line
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if line.startswith("torch==")
    ]
    assert torch_pin and torch_pin[0].endswith("+cpu"), "constraints.txt pins the CPU torch wheel"


def test_oci_labels_from_build_args(dockerfile: DockerfileParser) -> None:
    labels = dockerfile.labels
    assert labels["org.opencontainers.image.source"].startswith("https://")
    assert labels["org.opencontainers.image.version"] == __version__
    assert "org.opencontainers.image.revision" in labels
    label_text = " ".join(final_stage(dockerfile, "LABEL"))
    for key, arg in (("source", "SOURCE"), ("revision", "REVISION"), ("version", "VERSION")):
        assert f'org.opencontainers.image.{key}="${{{arg}}}"' in label_text


def test_writable_state_only_on_volumes_and_no_secrets(dockerfile: DockerfileParser) -> None:
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    env = " ".join(final_stage(dockerfile, "ENV"))
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert "PYTHONUNBUFFERED=1" in env  # the ready line reaches the log at once
    for cache in ("XDG_CACHE_HOME=/tmp", "MPLCONFIGDIR=/tmp"):
        assert cache in env
    created = " ".join(final_stage(dockerfile, "RUN"))
    assert "-o 10001 -g 10001" in created and "/var/lib/lensemble" in created
    copies = " ".join(i["value"] for i in instructions(dockerfile, "COPY"))
    assert "tests" not in copies and "certs" not in copies and ". ." not in copies
    assert not re.search(r"(?i)(password|secret|token|api_key)\s*=", text)
    assert not instructions(dockerfile, "ADD")


def test_dockerignore_keeps_private_and_bulky_files_out() -> None:
    patterns = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    for required in (
        "tests",
        "runs",
        "third_party/*/src",
        "**/.venv",
        "**/venv",
        "**/.ci-venv",
        "**/__pycache__",
        "**/.mypy_cache",
        "**/.pytest_cache",
        "**/.ruff_cache",
        ".git",
        "**/*.key",
    ):
        assert required in patterns, f".dockerignore does not exclude {required}"
    # Nothing the build copies is excluded.
    for needed in ("pyproject.toml", "README.md", "constraints.txt", "runtime"):
        assert needed not in patterns
    assert not any(p.startswith("!") for p in patterns)


def test_image_how_to_names_one_tag_per_cuda_line() -> None:
    section = IMAGE_HOW_TO
    for tag in ("-cpu", "-cu126", "-cu128", "sha-"):
        assert tag in section
    for command in ("lensemble image base", "lensemble image build", "--wheelhouse", "--ca-bundle"):
        assert command in section


def test_the_image_asks_for_huge_pages_as_the_runtime_documents(
    dockerfile: DockerfileParser,
) -> None:
    # lensemble.machinery.hugepages is the one home of these variables; the image must run with them
    # (bench/runtime_overhead.py measures with them by default, as the image runs).
    from lensemble.machinery.hugepages import HUGEPAGE_ENV

    envs = dockerfile.envs  # the final stage's environment
    missing = {k: v for k, v in HUGEPAGE_ENV.items() if envs.get(k) != v}
    assert not missing, f"the Dockerfile's final stage lacks ENV {missing}"
