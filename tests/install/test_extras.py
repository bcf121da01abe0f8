"""The base install (no [train] extra): config, rendering and infrastructure work; every command
that trains says which extra to install, in one line, with exit code 4.

Each run is a fresh interpreter whose ``sys.modules`` maps the [train] libraries to None, so any
``import torch`` (or grpc, gymnasium, ...) fails exactly as on a machine without the extra.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from lensemble.errors import EXIT_TOOL
from lensemble.extras import EXTRA_OF_IMPORT, MissingExtra, missing_extra
from tests.support.tools import require

#: What the [train] extra installs, as top-level import names.
TRAIN = sorted(name for name, (_, extra) in EXTRA_OF_IMPORT.items() if extra == "train")
#: The [train] libraries the Pulumi program must not import (pulumi itself needs grpc/protobuf).
NOT_FOR_INFRA = ["torch", "numpy", "safetensors", "gymnasium", "matplotlib", "prometheus_client"]


def _run_without(blocked: list[str], body: str, repo: Path) -> subprocess.CompletedProcess[str]:
    """Run ``body`` in a fresh interpreter in which every module in ``blocked`` is unimportable."""
    code = (
        "import sys\n"
        f"for name in {blocked!r}:\n"
        "    sys.modules[name] = None\n"
        "sys.modules['google.protobuf'] = None\n" * ("google" in blocked) + body
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=300
    )


def _cli_without_train(repo: Path, *argv: str, role: str = "") -> subprocess.CompletedProcess[str]:
    body = (
        "import os\n"
        f"if {role!r}: os.environ['LENSEMBLE_ROLE'] = {role!r}\n"
        "from lensemble.cli import main\n"
        f"sys.argv = ['lensemble', *{list(argv)!r}]\n"
        "main()\n"
    )
    return _run_without(TRAIN, body, repo)


@pytest.mark.parametrize("extra", ["train", "infra", "dp"])
def test_the_import_map_lists_exactly_the_extras_packages(repo: Path, extra: str) -> None:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((repo / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = {
        canonicalize_name(Requirement(r).name) for r in project["optional-dependencies"][extra]
    }
    mapped = {canonicalize_name(pkg) for pkg, ext in EXTRA_OF_IMPORT.values() if ext == extra}
    assert mapped == declared
    base = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    assert not base & {"torch", "numpy", "gymnasium", "matplotlib", "grpcio", "safetensors"}


def test_missing_extra_names_the_extra_only_for_libraries_an_extra_installs() -> None:
    torch = missing_extra(ModuleNotFoundError("No module named 'torch'", name="torch"))
    assert isinstance(torch, MissingExtra)
    assert (torch.package, torch.extra, torch.exit_code) == ("torch", "train", EXIT_TOOL)
    assert "pip install 'lensemble[train]'" in str(torch)
    nested = missing_extra(ModuleNotFoundError("x", name="grpc_health.v1"))
    assert nested is not None and nested.package == "grpcio-health-checking"
    proto = missing_extra(ModuleNotFoundError("x", name="google.protobuf"))
    assert proto is not None and proto.package == "protobuf"
    pulumi = missing_extra(ModuleNotFoundError("x", name="pulumi_aws"))
    assert pulumi is not None and pulumi.extra == "infra"
    # Our own module, a library no extra provides, and a broken (present) library are bugs.
    assert missing_extra(ModuleNotFoundError("x", name="lensemble.nothing")) is None
    assert missing_extra(ModuleNotFoundError("x", name="kiwisolver")) is None
    assert missing_extra(ImportError("cannot import name 'x' from 'torch'", name="torch")) is None


@pytest.mark.parametrize(
    ("argv", "role"),
    [
        (["simulate", "--rounds", "1"], ""),
        (["coordinator", "--config", "config/staging.yaml"], ""),
        (["participant", "--config", "config/staging.yaml", "--id", "alpine"], ""),
        (["serve", "--config", "config/staging.yaml"], "coordinator"),
        (["health", "--port", "1"], ""),
    ],
    ids=["simulate", "coordinator", "participant", "serve", "health"],
)
def test_training_commands_name_the_train_extra_in_one_line(
    repo: Path, argv: list[str], role: str
) -> None:
    proc = _cli_without_train(repo, *argv, role=role)
    assert proc.returncode == EXIT_TOOL, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: this command needs ")
    assert "the [train] extra" in lines[0]
    assert "pip install -c constraints.txt '.[train]'" in lines[0]


def test_config_and_render_commands_work_without_the_train_extra(
    repo: Path, tmp_path: Path
) -> None:
    runs = [
        ["--help"],
        ["config", "validate", "config/local.yaml"],
        ["config", "show", "config/staging.yaml"],
        ["config", "schema", "-o", str(tmp_path / "schema.json")],
        ["render", "helm-values", "--config", "config/staging.yaml"],
        ["render", "compose", "--config", "config/staging.yaml", "-o", str(tmp_path / "c.yaml")],
        ["certs", "init", str(tmp_path / "certs"), "--config", "config/staging.yaml"],
    ]
    body = (
        "from lensemble.cli import main\n"
        f"for argv in {runs!r}:\n"
        "    sys.argv = ['lensemble', *argv]\n"
        "    try:\n"
        "        main()\n"
        "    except SystemExit as exc:\n"
        "        assert exc.code in (0, None), (argv, exc.code)\n"
        "print('ALL OK')\n"
    )
    proc = _run_without(TRAIN, body, repo)
    assert proc.returncode == 0, proc.stderr
    assert "ALL OK" in proc.stdout
    assert (tmp_path / "certs" / "coordinator" / "tls.crt").is_file()


@pytest.mark.integration  # the Pulumi mock engine, in a child interpreter
@pytest.mark.slow
def test_the_pulumi_program_runs_without_the_train_libraries(repo: Path) -> None:
    require("pulumi")
    body = (
        "from tests.infra.recording import run_stack\n"
        "capture = run_stack('staging', 'aws')\n"
        "print('RESOURCES', len(capture.resources))\n"
    )
    proc = _run_without(NOT_FOR_INFRA, body, repo)
    assert proc.returncode == 0, proc.stderr[-3000:]
    count = int(proc.stdout.split("RESOURCES", 1)[1].split()[0])
    assert count > 10
