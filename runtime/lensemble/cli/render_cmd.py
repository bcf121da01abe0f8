"""``lensemble render``: deployment artifacts rendered from a config."""

from __future__ import annotations

from pathlib import Path

import typer

from lensemble.cli.options import ConfigOption, OutputFileOption, SetOption, load
from lensemble.cli.output import emit, is_stdout, is_stream, status

app = typer.Typer(
    help="Render deployment artifacts (Compose, Helm values, Kubernetes manifests) from a config.",
    no_args_is_help=True,
)


# ------------------------------------------------------------------------------ compose
@app.command("compose")
def compose(
    config: Path | None = ConfigOption,
    set_: list[str] = SetOption,
    output: Path | None = typer.Option(
        None,
        "--output",
        "-o",
        help="Write the Compose file here, and the config its containers read next to it "
        "(lensemble.yaml). Without it, or with -o -, the Compose file goes to stdout.",
        metavar="FILE",
    ),
    certs: str = typer.Option(
        "certs",
        "--certs",
        help="Folder `lensemble certs init` fills, relative to the Compose file's folder.",
        metavar="DIR",
    ),
    gpu_tag: str | None = typer.Option(
        None,
        "--gpu-tag",
        help="Image tag of the gpu profile (default: the config's tag with the cu126 line).",
        metavar="TAG",
    ),
) -> None:
    """Render a Docker Compose file (profiles cpu and gpu) from a config."""
    import shlex

    from lensemble.config import default_config_path
    from lensemble.render.compose import render_compose
    from lensemble.render.compose_files import compose_header, compose_text, write_compose

    cfg = load(config, set_)
    path = str(config) if config is not None else str(default_config_path())
    flags = [arg for item in set_ or [] for arg in ("--set", item)]
    source = shlex.join([path, *flags])
    if is_stdout(output) or is_stream(output):
        # One text into a stream: the config beside it would land in /dev (or the cwd).
        compose_map = render_compose(cfg, certs_dir=certs, gpu_tag=gpu_tag)
        header = compose_header(cfg, source=source, certs_dir=certs)
        emit(compose_text(compose_map, header), output)
        status(
            "note: the containers also need the config file lensemble.yaml next to the "
            "Compose file; render with -o FILE to write both."
        )
        return
    assert output is not None
    command = shlex.join(["lensemble", "render", "compose", "--config", path, *flags])
    command += " " + shlex.join(["-o", str(output)])
    if certs != "certs":
        command += " " + shlex.join(["--certs", certs])
    if gpu_tag is not None:
        command += " " + shlex.join(["--gpu-tag", gpu_tag])
    files = write_compose(
        cfg, output, command=command, source=source, certs_dir=certs, gpu_tag=gpu_tag
    )
    written = [files.compose, files.config, files.prometheus, files.alerts]
    names = [str(path) for path in written if path is not None]
    status(f"wrote {', '.join(names[:-1])} and {names[-1]}")


# ------------------------------------------------------------------- Helm and Kubernetes (k8s)
@app.command("helm-values")
def helm_values(
    config: Path | None = ConfigOption,
    mode: str = typer.Option(
        "all", "--mode", "-m", help="all, coordinator, or participant (one trust domain)."
    ),
    trust_domain: str | None = typer.Option(
        None, "--trust-domain", "-t", help="Trust domain of a participant-mode release."
    ),
    output: Path | None = OutputFileOption,
    set_: list[str] = SetOption,
) -> None:
    """Print the Helm values (charts/lensemble) that deploy a config."""
    import yaml

    from lensemble.config import config_hash
    from lensemble.render.helm_values import render_helm_values

    cfg = load(config, set_)
    values = render_helm_values(cfg, mode=mode, trust_domain=trust_domain)
    text = (
        f"# Helm values for charts/lensemble, mode {mode}, from {config or 'the default config'}\n"
        f"# config hash: {config_hash(cfg)}\n" + yaml.safe_dump(values, sort_keys=False, width=100)
    )
    emit(text, output, announce=True)


@app.command("k8s")
def k8s(
    config: Path | None = ConfigOption,
    env: str | None = typer.Option(
        None,
        "--env",
        "-e",
        help="Overlay (overlays/ENV); default: deployment.environment.",
    ),
    output: Path | None = typer.Option(
        None,
        "--output",
        "-o",
        help="Write DIR/lensemble-ENV.yaml instead of printing (-o -: stdout).",
        metavar="DIR",
    ),
    chart: Path | None = typer.Option(None, "--chart", help="Chart directory.", metavar="DIR"),
    overlays: Path | None = typer.Option(
        None,
        "--overlays",
        help="Kustomize tree with ENV/ (and ENV/base/) and components/ (default: overlays).",
        metavar="DIR",
    ),
    set_: list[str] = SetOption,
) -> None:
    """Render the chart (Helm v4) and apply the overlay (kubectl kustomize): final manifests."""
    from lensemble.render import k8s as k8s_render
    from lensemble.render.k8s_policy import enforce

    cfg = load(config, set_)
    environment = k8s_render.env_from_config(cfg, env)
    rendered = k8s_render.render_k8s(cfg, environment, chart=chart, overlays=overlays)
    enforce(rendered.manifests, cfg, source=f"overlays/{environment}")
    if is_stdout(output) or is_stream(output):
        emit(k8s_render.dump_manifests(rendered.manifests), output)
    else:
        assert output is not None
        path = k8s_render.write_manifests(rendered.manifests, output, environment)
        status(f"wrote {path} ({len(rendered.manifests)} objects)")
