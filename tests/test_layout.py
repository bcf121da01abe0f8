"""The repository's top level stays the design card's (RFC-0016 §2 and §4) plus what earns a place.

Each allowed entry says why it is at the top; a new entry fails here until it is added with its
reason (or moved under an existing one). Every environment config in ``config/`` has its overlay
at ``overlays/<environment>/kustomization.yaml``, where users of the card look for it.
"""

from __future__ import annotations

import shutil
import subprocess
from fnmatch import fnmatch

import pytest

from lensemble.config import load_config
from tests.conftest import REPO

#: Every top-level entry (a name or a glob), and why it sits at the top.
ALLOWED: dict[str, str] = {
    "runtime": "the lensemble package (RFC-0016 §4 layout)",
    "config": "the configs every substrate renders from (RFC-0016 §4: one config source)",
    "charts": "the Helm chart (RFC-0016 §4 IaC)",
    "overlays": "the Kustomize overlays, one per environment (RFC-0016 §4 IaC)",
    "infra": "the Pulumi program (RFC-0016 §4 IaC)",
    "Pulumi.yaml": "the Pulumi project file (RFC-0016 §4 layout)",
    "Pulumi.*.yaml": "Pulumi stack files, which Pulumi reads beside Pulumi.yaml",
    "third_party": "vendored upstream code (RFC-0016 §2)",
    "tests": "the test suite (RFC-0016 §4 layout)",
    "pyproject.toml": "the package and its tool settings (RFC-0016 §4 layout)",
    "compose": "the Compose substrate (RFC-0016 §4 layer 1), generated from config/local.yaml",
    "Dockerfile": "the one image for every role, where `docker build .` looks for it",
    "image": "the files image builds use besides the Dockerfile (pip wrapper, Prometheus image)",
    ".dockerignore": "the build context's exclusions, read beside the Dockerfile",
    "README.md": "the door: install, quick start, map",
    "constraints.txt": "the pins of the README's install command",
    "docs": "concepts, how-tos, reference",
    "tools": "checkout tools (vendor sync, kind, regenerate, constraints)",
    "bench": "the benchmarks behind docs/performance.md",
    ".ci": "CI's entry point (.ci/run)",
    ".gitignore": "what git leaves out (read at the top)",
}

#: What the design card (RFC-0016 §4) puts at the top level.
CARD = (
    "runtime",
    "infra",
    "charts",
    "overlays",
    "third_party",
    "config",
    "tests",
    "Pulumi.yaml",
    "pyproject.toml",
)


def unexpected(names: set[str]) -> list[str]:
    """The names no entry of :data:`ALLOWED` covers, sorted."""
    return sorted(n for n in names if not any(fnmatch(n, pattern) for pattern in ALLOWED))


def top_level() -> set[str]:
    """The top-level names git tracks or would track (untracked files not ignored)."""
    git = shutil.which("git")
    if git is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout (or no git): the top level is what git tracks")
    proc = subprocess.run(
        [git, "-C", str(REPO), "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        capture_output=True,
        check=True,
    )
    paths = [p for p in proc.stdout.decode().split("\0") if p]
    # A file deleted in the work tree but not yet in the index is gone from the layout.
    return {p.split("/", 1)[0] for p in paths if (REPO / p).exists()}


def test_the_top_level_holds_only_allowed_entries() -> None:
    names = top_level()
    assert unexpected(names) == [], "add the entry to ALLOWED with its reason, or move it"
    assert set(CARD) <= names
    stale = [p for p in ALLOWED if not any(fnmatch(n, p) for n in names)]
    assert stale == [], f"allowed entries that no longer exist (remove them): {stale}"


def test_the_allow_list_catches_a_new_entry() -> None:
    assert unexpected({"runtime", "deploy", "scripts", "Pulumi.staging.yaml"}) == [
        "deploy",
        "scripts",
    ]


def test_each_environment_config_has_its_overlay() -> None:
    configs = sorted((REPO / "config").glob("*.yaml"))
    assert configs
    environments = {load_config(path).deployment.environment for path in configs}
    for env in environments:
        assert (REPO / "overlays" / env / "kustomization.yaml").is_file(), env
    overlays = {p.parent.name for p in (REPO / "overlays").glob("*/kustomization.yaml")}
    assert overlays == environments, "an overlay without a config in config/ (or the reverse)"
