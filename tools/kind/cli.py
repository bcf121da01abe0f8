"""``python -m tools.kind``: a local kind cluster running the local overlay, end to end.

A development tool of the source checkout (it builds the image from the checkout's Dockerfile and
renders its chart and overlays); it is not part of the installed package nor of the image.

``up`` creates the cluster (one control plane, one worker per trust domain), builds the image and
side-loads it, creates one TLS Secret per identity (``lensemble certs init``), applies the local
overlay, waits for every participant to be ready, follows a few rounds of the coordinator's
ledger and prints the hash chain (checked: each round's parent is the previous round's model).
``down`` deletes the cluster. Needs Docker, kind and kubectl.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from lensemble.cli.options import ConfigOption, SetOption, load
from lensemble.errors import RoundError, ToolMissing, UsageError
from tools.entry import run_tool

if TYPE_CHECKING:
    from lensemble.config import LensembleConfig
    from lensemble.federation.ledger import RoundRecord

app = typer.Typer(
    name="python -m tools.kind",
    help="Run the local overlay on a kind cluster (needs Docker, kind and kubectl). Run from the "
    "repository root of a source checkout.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ToolMissing(
            f"{name} is not on PATH; `python -m tools.kind` needs docker, kind and kubectl.",
            remediation=f"Install {name} and retry.",
        )
    return path


def _run(cmd: list[str], *, stdin: str | None = None, check: bool = True) -> str:
    sys.stderr.write("+ " + " ".join(cmd) + "\n")
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise ToolMissing(
            f"`{' '.join(cmd[:3])} ...` failed (exit {proc.returncode}): "
            f"{(proc.stderr or proc.stdout).strip()[-2000:]}"
        )
    return proc.stdout


def _certificates(cfg: LensembleConfig, kubectl: list[str], workdir: Path) -> None:
    """One Secret per identity from ``lensemble certs init``, in the identity's namespace."""
    import yaml

    from lensemble.render.helm_values import pod_config
    from lensemble.render.names import (
        COORDINATOR,
        coordinator_namespace,
        participant_namespace,
        tls_secret_name,
    )

    view = pod_config(cfg)
    config_file = workdir / "config.yaml"
    config_file.write_text(yaml.safe_dump(view.model_dump(mode="json")), encoding="utf-8")
    certs = workdir / "certs"
    cli = [sys.executable, "-c", "from lensemble.cli import main; main()"]
    _run([*cli, "certs", "init", str(certs), "--config", str(config_file)])
    identities = {COORDINATOR: coordinator_namespace(cfg)}
    for p in cfg.federation.participants:
        identities[p.id] = participant_namespace(cfg, p.trust_domain)
    for identity, namespace in identities.items():
        folder = certs / identity
        secret = _run(
            [
                *kubectl,
                "create",
                "secret",
                "generic",
                tls_secret_name(cfg, identity),
                "-n",
                namespace,
                f"--from-file=tls.crt={folder / 'tls.crt'}",
                f"--from-file=tls.key={folder / 'tls.key'}",
                f"--from-file=ca.crt={folder / 'ca.crt'}",
                "--dry-run=client",
                "-o",
                "yaml",
            ]
        )
        _run([*kubectl, "apply", "-f", "-"], stdin=secret)


def _follow_rounds(
    cfg: LensembleConfig, kubectl: list[str], rounds: int, timeout_s: float
) -> list[RoundRecord]:
    """Poll the coordinator's ledger until ``rounds`` rounds are committed; check the chain.

    Raises:
        RoundError: Fewer rounds were committed within ``timeout_s`` seconds.
        IntegrityError: The committed rounds do not chain.
    """
    from lensemble.federation.ledger import RoundRecord, committed_chain
    from lensemble.render.container import STATE_DIR
    from lensemble.render.names import coordinator_name, coordinator_namespace

    ledger = f"{STATE_DIR}/{cfg.observability.ledger_path}"
    target = [
        *kubectl,
        "exec",
        "-n",
        coordinator_namespace(cfg),
        f"deployment/{coordinator_name(cfg)}",
        "--",
        "cat",
        ledger,
    ]
    deadline = time.monotonic() + timeout_s
    closed: list[RoundRecord] = []
    while time.monotonic() < deadline:
        out = _run(target, check=False)
        records = [
            RoundRecord(**json.loads(line))
            for line in out.splitlines()
            if line.strip().startswith("{")
        ]
        committed_chain(records)
        closed = [r for r in records if r.state == "closed"]
        if len(closed) >= rounds:
            return closed[:rounds]
        time.sleep(5)  # polling a live cluster, not a test assertion
    raise RoundError(
        f"only {len(closed)} of {rounds} rounds were committed to {ledger} "
        f"within {timeout_s:.0f} s.",
        remediation="Inspect the pods with kubectl get pods -A and kubectl logs.",
    )


@app.command()
def up(
    config: Path | None = ConfigOption,
    rounds: int = typer.Option(3, "--rounds", min=1, help="Rounds to follow before reporting."),
    build: bool = typer.Option(
        True,
        "--build/--no-build",
        help="Build the image first (as `lensemble image build`; without a registry, run that "
        "with its --base, --wheelhouse and --ca-bundle and pass --no-build).",
    ),
    timeout: float = typer.Option(900.0, "--timeout", help="Seconds to wait for each stage."),
    set_: list[str] = SetOption,
) -> None:
    """Create the kind cluster, deploy the local overlay and report the hash chain."""
    import yaml

    from lensemble.render import k8s as k8s_render
    from lensemble.render.k8s_policy import enforce
    from lensemble.render.kind import cluster_name, kind_cluster
    from lensemble.render.names import TRUST_DOMAIN_LABEL, participant_namespace

    cfg = load(config, set_)
    if cfg.deployment.environment != "local":
        raise UsageError(
            f"deployment.environment is '{cfg.deployment.environment}'; kind runs local configs.",
            remediation="Pass --config config/local.yaml.",
        )
    kind, docker, kubectl_exe = _tool("kind"), _tool("docker"), _tool("kubectl")
    name = cluster_name(cfg)
    kubectl = [kubectl_exe, "--context", f"kind-{name}"]
    image = f"{cfg.deployment.image.repository}:{cfg.deployment.image.tag}"
    rendered = k8s_render.render_k8s(cfg, "local")
    enforce(rendered.manifests, cfg, source="overlays/local")
    with tempfile.TemporaryDirectory(prefix="lensemble-kind-") as tmp:
        work = Path(tmp)
        if name not in _run([kind, "get", "clusters"]).split():
            cluster_file = work / "kind-cluster.yaml"
            cluster_file.write_text(yaml.safe_dump(kind_cluster(cfg)), encoding="utf-8")
            _run([kind, "create", "cluster", "--config", str(cluster_file), "--wait", "300s"])
        if build:
            # The one image build (BuildKit, staged context); its options (--base, wheelhouse,
            # CA bundle) are `lensemble image build`'s: build that way and pass --no-build.
            from lensemble import __version__
            from lensemble.image.build import build_image, find_source_tree
            from lensemble.image.client import find_build_client

            build_image(
                find_build_client(docker),
                find_source_tree(k8s_render.repo_root()),
                version=__version__,
                extra_tags=[image],
                echo=typer.echo,
            )
        _run([kind, "load", "docker-image", image, "--name", name])
        manifests = work / "manifests.yaml"
        manifests.write_text(k8s_render.dump_manifests(rendered.manifests), encoding="utf-8")
        _run([*kubectl, "apply", "-f", str(manifests)])
        if cfg.network.tls.enabled:
            _certificates(cfg, kubectl, work)
    for td in cfg.trust_domains:
        _run(
            [
                *kubectl,
                "wait",
                "pod",
                "-n",
                participant_namespace(cfg, td),
                "-l",
                f"{TRUST_DOMAIN_LABEL}={td}",
                "--for=condition=Ready",
                f"--timeout={int(timeout)}s",
            ]
        )
    typer.echo(f"every participant is ready; following {rounds} rounds")
    for record in _follow_rounds(cfg, kubectl, rounds, timeout):
        line = {"round": record.round, "parent_hash": record.parent_hash}
        typer.echo(json.dumps({**line, "model_hash": record.model_hash}))
    typer.echo(
        "delete the cluster with: python -m tools.kind down --config "
        f"{config or 'config/local.yaml'}"
    )


@app.command()
def down(
    config: Path | None = ConfigOption,
    set_: list[str] = SetOption,
) -> None:
    """Delete the kind cluster of the local config."""
    from lensemble.render.kind import cluster_name

    cfg = load(config, set_)
    _run([_tool("kind"), "delete", "cluster", "--name", cluster_name(cfg)])
    typer.echo(f"deleted kind cluster {cluster_name(cfg)}")


def main(argv: list[str] | None = None) -> None:
    """Run ``python -m tools.kind`` with ``argv`` (default: ``sys.argv[1:]``)."""
    run_tool(app, "python -m tools.kind", argv)
