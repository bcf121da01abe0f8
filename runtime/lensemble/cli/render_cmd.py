"""``lensemble render``: deployment artifacts rendered from a config."""

from __future__ import annotations

from pathlib import Path

import typer

from lensemble.cli.options import ConfigOption, SetOption, load

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
        "(lensemble.yaml). Without it the Compose file goes to stdout.",
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
    import sys

    from lensemble.config import default_config_path
    from lensemble.render.compose import compose_header, compose_text, render_compose, write_compose

    cfg = load(config, set_)
    path = str(config) if config is not None else str(default_config_path())
    flags = [arg for item in set_ or [] for arg in ("--set", item)]
    source = shlex.join([path, *flags])
    if output is None:
        compose_map = render_compose(cfg, certs_dir=certs, gpu_tag=gpu_tag)
        header = compose_header(cfg, source=source, certs_dir=certs)
        sys.stdout.write(compose_text(compose_map, header))
        sys.stderr.write(
            "note: the containers also need the config file lensemble.yaml next to the "
            "Compose file; render with -o FILE to write both.\n"
        )
        return
    command = shlex.join(["lensemble", "render", "compose", "--config", path, *flags])
    command += " " + shlex.join(["-o", str(output)])
    if certs != "certs":
        command += " " + shlex.join(["--certs", certs])
    if gpu_tag is not None:
        command += " " + shlex.join(["--gpu-tag", gpu_tag])
    files = write_compose(
        cfg, output, command=command, source=source, certs_dir=certs, gpu_tag=gpu_tag
    )
    typer.echo(f"wrote {files.compose} and {files.config}")
