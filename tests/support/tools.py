"""One shared way for tests to need an external tool.

A test that needs a tool calls :func:`require`. When the tool is missing the test is skipped with
the reason, unless the tool is listed in ``LENSEMBLE_REQUIRE_TOOLS`` (comma-separated), in which
case the test fails: CI lists every tool its machines have, so nothing that can run there is
silently skipped.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import uuid

import pytest

#: Every tool name a test may require, with how to detect it.
KNOWN_TOOLS = (
    "kubectl",
    "helm",
    "kubernetes-validate",
    "docker-compose",
    "docker",
    "image",
    "kind",
    "netns",
    "pypi",
    "pulumi",
    "worldmodel",
    "promtool",
    "prometheus-image",
)


def required_tools() -> set[str]:
    """Tools listed in ``LENSEMBLE_REQUIRE_TOOLS``."""
    raw = os.environ.get("LENSEMBLE_REQUIRE_TOOLS", "")
    return {t.strip() for t in raw.split(",") if t.strip()}


def _run_ok(*cmd: str, timeout: float = 20.0) -> bool:
    try:
        return (
            subprocess.run(cmd, capture_output=True, timeout=timeout, check=False).returncode == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


@functools.cache
def probe(tool: str) -> str | None:
    """None when ``tool`` is usable here, else the reason it is not."""
    if tool not in KNOWN_TOOLS:
        raise ValueError(f"unknown tool {tool!r}; add it to KNOWN_TOOLS")
    if tool == "kubectl":
        if shutil.which("kubectl") is None:
            return "kubectl is not on PATH"
        return None if _run_ok("kubectl", "kustomize", "--help") else "kubectl kustomize fails"
    if tool == "helm":
        return None if importlib.util.find_spec("helm_python") else "helm-python-sdk not installed"
    if tool == "kubernetes-validate":
        found = importlib.util.find_spec("kubernetes_validate")
        return None if found else "kubernetes-validate not installed"
    if tool == "docker-compose":
        return None if shutil.which("docker-compose") else "docker-compose is not on PATH"
    if tool == "docker":
        if shutil.which("docker") is None:
            return "docker is not on PATH"
        return None if _run_ok("docker", "info") else "no Docker engine is reachable"
    if tool == "image":
        return probe("docker") or _image_problem()
    if tool == "kind":
        if shutil.which("kind") is None:
            return "kind is not on PATH"
        return probe("docker")
    if tool == "netns":
        if shutil.which("ip") is None:
            return "iproute2 (ip) is not on PATH"
        name = f"lens-probe-{uuid.uuid4().hex[:6]}"
        if not _run_ok("ip", "netns", "add", name):
            return "cannot create network namespaces (needs root and iproute2)"
        _run_ok("ip", "netns", "del", name)
        return None
    if tool == "pypi":
        try:
            with socket.create_connection(("pypi.org", 443), timeout=5):
                return None
        except OSError as exc:
            return f"the package index is unreachable ({exc})"
    if tool == "pulumi":
        return None if importlib.util.find_spec("pulumi") else "the [infra] extra is not installed"
    if tool == "promtool":
        if shutil.which("promtool") is None:
            return "promtool is not on PATH (Debian: apt-get install prometheus)"
        return None if _run_ok("promtool", "--version") else "promtool --version fails"
    if tool == "prometheus-image":
        from lensemble.render.prometheus import PROMETHEUS_IMAGE

        if shutil.which("docker") is None:
            return "docker is not on PATH"
        if _run_ok("docker", "image", "inspect", PROMETHEUS_IMAGE, timeout=60):
            return None
        return (
            f"{PROMETHEUS_IMAGE} is not on the engine (build it: docker build -t "
            f"{PROMETHEUS_IMAGE} -f image/prometheus/Dockerfile image/prometheus)"
        )
    if tool == "worldmodel":
        found = importlib.util.find_spec("stable_worldmodel")
        return None if found else "the [worldmodel] extra is not installed"
    raise AssertionError(tool)


def current_image() -> str:
    """The CPU image tag that ``lensemble image build`` gives a build of this checkout."""
    from lensemble import __version__
    from lensemble.image import image_tag

    return image_tag(__version__)


def _image_problem() -> str | None:
    """None when the engine holds the CPU image built from this very checkout."""
    from lensemble.image import CONTEXT_DIGEST_LABEL
    from lensemble.image.build import context_digest
    from tests.conftest import REPO

    tag = current_image()
    try:
        done = subprocess.run(
            ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", tag],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "docker image inspect did not answer"
    if done.returncode != 0:
        return f"{tag} is not on the engine (build it: `lensemble image build`, see README)"
    labels = json.loads(done.stdout or "null") or {}
    if labels.get(CONTEXT_DIGEST_LABEL) != context_digest(REPO):
        return f"{tag} was built from other sources than this checkout (rebuild: `lensemble image build`)"
    return None


def require(tool: str) -> None:
    """Skip the calling test when ``tool`` is missing; fail instead when CI requires it."""
    reason = probe(tool)
    if reason is None:
        return
    if tool in required_tools():
        pytest.fail(f"{tool} is required by LENSEMBLE_REQUIRE_TOOLS but unavailable: {reason}")
    pytest.skip(f"{tool} unavailable: {reason}")


def require_vendored_worldmodel() -> None:
    """Skip (or fail, when CI requires ``worldmodel``) unless stable-worldmodel is usable.

    Usable means: the vendored tree is synced (``python -m tools.vendor sync``) and the
    ``[worldmodel]`` extra is installed; the skip reason says how to get there.
    """
    from lensemble.data import vendored_envs
    from lensemble.errors import ToolMissing

    try:
        vendored_envs.use_vendored("stable_worldmodel", "stable_worldmodel")
    except ToolMissing as exc:
        if "worldmodel" in required_tools():
            pytest.fail(f"worldmodel is required by LENSEMBLE_REQUIRE_TOOLS: {exc}")
        pytest.skip(f"worldmodel unavailable: {exc}")
    require("worldmodel")
    pytest.importorskip("loguru", reason="the [worldmodel] extra is not installed")
