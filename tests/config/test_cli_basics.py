"""The CLI's entry points, and that config commands never import torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lensemble import __version__
from tests.support.cli import run_cli


def test_version() -> None:
    result = run_cli("--version")
    assert result.code == 0
    assert result.out.strip() == f"lensemble {__version__}"


def test_help_lists_config_commands() -> None:
    result = run_cli("--help")
    assert result.code == 0
    assert "config" in result.out


def test_importing_lensemble_and_config_commands_never_import_torch(repo: Path) -> None:
    code = (
        "import sys\n"
        "import lensemble, lensemble.config\n"
        "from lensemble.cli import main\n"
        "for argv in (['config', 'validate', 'config/local.yaml'],\n"
        "             ['config', 'show', 'config/staging.yaml'], ['config', 'schema'], ['--help']):\n"
        "    sys.argv = ['lensemble', *argv]\n"
        "    try:\n"
        "        main()\n"
        "    except SystemExit as exc:\n"
        "        assert exc.code in (0, None), (argv, exc.code)\n"
        "heavy = sorted(m for m in ('torch', 'grpc', 'gymnasium', 'matplotlib', 'pulumi',\n"
        "                          'helm_python') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=True
    )
    assert "HEAVY []" in proc.stdout, proc.stdout + proc.stderr


def test_console_script_exit_codes(repo: Path) -> None:
    ok = subprocess.run(
        ["lensemble", "config", "validate", "config/local.yaml"], cwd=repo, capture_output=True
    )
    assert ok.returncode == 0
    bad = subprocess.run(
        ["lensemble", "config", "validate", "config/local.yaml", "--set", "federation.quorum=99"],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr


def test_unusable_output_paths_are_one_sentence_not_a_traceback(tmp_path: Path) -> None:
    result = run_cli("config", "schema", "-o", str(tmp_path))  # a folder, not a file
    assert result.code == 2
    assert result.err.startswith(f"error: cannot use {tmp_path}: Is a directory;")
    nested = tmp_path / "new" / "folder" / "schema.json"
    assert run_cli("config", "schema", "-o", str(nested)).code == 0  # folders are created
    assert nested.read_text().startswith("{")


def test_network_roles_refuse_an_in_process_config(repo: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(repo)
    for role in (["coordinator"], ["participant", "--id", "alpine"]):
        result = run_cli(*role, "--config", "config/local.yaml")
        assert result.code == 2
        assert "federation.transport is 'in_process'" in result.err
        assert "--set federation.transport=network" in result.err
