"""``lensemble render helm-values`` and ``lensemble render k8s``: output, exit codes, messages."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from lensemble.config import config_hash, load_config
from lensemble.render.helm_values import render_helm_values
from lensemble.render.k8s import parse_manifests
from tests.k8s.renders import REPO, render
from tests.support.cli import run_cli, run_tool
from tests.support.tools import require


def test_helm_values_writes_the_values_of_a_config(tmp_path: Path, in_repo: Path) -> None:
    out = tmp_path / "values.yaml"
    result = run_cli(
        "render", "helm-values", "--config", "config/sovereign-prod.yaml",
        "--mode", "participant", "--trust-domain", "org-paris", "-o", str(out),
    )  # fmt: skip
    assert result.code == 0, result.err
    text = out.read_text(encoding="utf-8")
    cfg = load_config("config/sovereign-prod.yaml")
    assert f"# config hash: {config_hash(cfg)}" in text
    values = yaml.safe_load(text)
    assert values == render_helm_values(cfg, mode="participant", trust_domain="org-paris")
    assert values["trustDomainIsolation"] is True


def test_helm_values_to_stdout_honours_set(in_repo: Path) -> None:
    result = run_cli(
        "render", "helm-values", "-c", "config/staging.yaml", "--set", "federation.rounds=3"
    )
    assert result.code == 0, result.err
    values = yaml.safe_load(result.out)
    assert values["config"]["federation"]["rounds"] == 3
    assert values["mode"] == "all"
    assert values["trustDomainIsolation"] is False


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--mode", "participant"], "--trust-domain"),
        (["--mode", "participant", "--trust-domain", "org-mars"], "org-mars"),
        (["--mode", "coordinator", "--trust-domain", "org-paris"], "--trust-domain only"),
        (["--mode", "everything"], "mode 'everything'"),
        (["--set", "network.auth=token"], "network.auth"),
        (["--set", "run.root_seed=9007199254740993"], "run.root_seed"),
        (["--set", "network.host=coordinator"], "network.host"),
        (["--set", "federation.participants[0].trust_domain=coordinator"], "trust_domain"),
    ],
)
def test_helm_values_refuses_bad_input_naming_it(
    args: list[str], needle: str, in_repo: Path
) -> None:
    result = run_cli("render", "helm-values", "-c", "config/sovereign-prod.yaml", *args)
    assert result.code == 2
    assert needle in result.err
    assert "Traceback" not in result.err


def test_render_k8s_writes_the_overlay_output(tmp_path: Path, in_repo: Path) -> None:
    result = run_cli(
        "render", "k8s", "-c", "config/staging.yaml", "--env", "staging", "-o", str(tmp_path)
    )
    assert result.code == 0, result.err
    written = tmp_path / "lensemble-staging.yaml"
    assert str(written) in result.err
    docs = parse_manifests(written.read_text(encoding="utf-8"), str(written))
    assert docs == render("kustomize-staging")


def test_render_k8s_prints_to_stdout_with_env_from_config(in_repo: Path) -> None:
    require("helm")
    require("kubectl")
    result = run_cli("render", "k8s", "-c", "config/local.yaml")
    assert result.code == 0, result.err
    assert parse_manifests(result.out, "stdout") == render("kustomize-local")


def test_render_k8s_for_another_config_renders_its_own_base(in_repo: Path) -> None:
    require("helm")
    require("kubectl")
    placement = '{"alpine-two": {"node_selector": {"lensemble.dev/trust-domain": "alpine-two"}}}'
    result = run_cli(
        "render", "k8s", "-c", "config/local.yaml",
        "--set", "federation.participants[0].trust_domain=alpine-two",
        "--set", f"deployment.trust_domains={placement}",
    )  # fmt: skip
    assert result.code == 0, result.err
    docs = parse_manifests(result.out, "stdout")
    pinned = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"].get("nodeSelector")
        for d in docs
        if d["kind"] == "StatefulSet"
    }
    assert pinned["lensemble-local-alpine-two"] == {"lensemble.dev/trust-domain": "alpine-two"}
    assert pinned["lensemble-local-coastal-robotics"] is None
    assert "lensemble-local-alpine-labs" not in pinned
    # Every workload reads this config, not the committed base's.
    (config_text,) = {d["data"]["config.yaml"] for d in docs if d["kind"] == "ConfigMap"}
    assert "alpine-two" in config_text


def test_render_k8s_refuses_a_mismatched_env(in_repo: Path) -> None:
    result = run_cli("render", "k8s", "-c", "config/staging.yaml", "--env", "local")
    assert result.code == 2
    assert "deployment.environment 'staging'" in result.err


def test_render_k8s_without_kubectl_is_a_missing_tool(
    in_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require("helm")
    monkeypatch.setenv("PATH", str(tmp_path))
    result = run_cli("render", "k8s", "-c", "config/staging.yaml")
    assert result.code == 4
    assert "kubectl is not on PATH" in result.err


def test_render_k8s_without_helm_is_a_missing_tool(
    in_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "helm_python", None)  # import fails as if not installed
    result = run_cli("render", "k8s", "-c", "config/staging.yaml")
    assert result.code == 4
    assert "helm-python-sdk" in result.err


def _render_staging_with_overlay(tmp_path: Path, overlay: str) -> Any:
    """``lensemble render k8s`` of config/staging.yaml with this staging overlay text."""
    require("helm")
    require("kubectl")
    tree = tmp_path / "overlays"
    shutil.copytree(REPO / "overlays", tree)
    kustomization = tree / "staging/kustomization.yaml"
    kustomization.write_text(overlay, encoding="utf-8")
    return run_cli("render", "k8s", "-c", "config/staging.yaml", "--overlays", str(tree))


def test_a_broken_overlay_is_named(tmp_path: Path, in_repo: Path) -> None:
    broken = "resources: [base]\ncomponents: [../components/missing]\n"
    result = _render_staging_with_overlay(tmp_path, broken)
    assert result.code == 2
    assert "staging/kustomization.yaml" in result.err


def test_an_overlay_that_breaks_the_policy_fails_closed(tmp_path: Path, in_repo: Path) -> None:
    overlay = (REPO / "overlays/staging/kustomization.yaml").read_text(encoding="utf-8") + (
        "patches:\n  - target: {kind: Deployment}\n    patch: |-\n"
        "      - {op: add, path: /spec/template/spec/hostNetwork, value: true}\n"
    )
    result = _render_staging_with_overlay(tmp_path, overlay)
    assert result.code == 3
    assert "no-host-access" in result.err
    assert "overlays/staging" in result.err


def test_helm_values_does_not_import_helm(repo: Path) -> None:
    code = (
        "import sys\n"
        "from lensemble.cli import main\n"
        "sys.argv = ['lensemble', 'render', 'helm-values', '-c', 'config/staging.yaml']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exc:\n"
        "    assert exc.code in (0, None), exc.code\n"
        "print('HEAVY', sorted(m for m in ('helm_python', 'torch', 'grpc', 'kubernetes_validate')"
        " if m in sys.modules), file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stderr


def test_kind_up_needs_docker_kind_and_kubectl(
    in_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    result = run_tool("kind", "up", "-c", "config/local.yaml")
    assert result.code == 4
    assert "kind is not on PATH" in result.err


def test_kind_up_runs_local_configs_only(in_repo: Path) -> None:
    result = run_tool("kind", "up", "-c", "config/staging.yaml")
    assert result.code == 2
    assert "deployment.environment is 'staging'" in result.err
