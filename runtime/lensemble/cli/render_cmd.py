"""``lensemble render``: deployment artifacts rendered from a config."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from lensemble.cli.options import ConfigOption, SetOption, load

app = typer.Typer(
    help="Render deployment artifacts (Compose, Helm values, Kubernetes manifests) from a config.",
    no_args_is_help=True,
)


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
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Write to this file instead of stdout.", metavar="FILE"
    ),
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
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text, encoding="utf-8")


@app.command("k8s")
def k8s(  # noqa: PLR0917 - typer options are parameters
    config: Path | None = ConfigOption,
    env: str | None = typer.Option(
        None, "--env", "-e", help="Overlay (overlays/ENV); default: deployment.environment."
    ),
    output: Path | None = typer.Option(
        None,
        "--output",
        "-o",
        help="Write DIR/lensemble-ENV.yaml instead of printing.",
        metavar="DIR",
    ),
    chart: Path | None = typer.Option(None, "--chart", help="Chart directory.", metavar="DIR"),
    overlays: Path | None = typer.Option(
        None, "--overlays", help="Overlays directory.", metavar="DIR"
    ),
    update_base: bool = typer.Option(
        False,
        "--update-base",
        help="Also rewrite the committed generated files of overlays/ENV (base, kind files).",
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
    if update_base:
        for path in k8s_render.write_overlay_files(
            cfg, environment, chart=chart, overlays=overlays
        ):
            sys.stderr.write(f"wrote {path}\n")
    if output is None:
        sys.stdout.write(k8s_render.dump_manifests(rendered.manifests))
    else:
        path = k8s_render.write_manifests(rendered.manifests, output, environment)
        sys.stderr.write(f"wrote {path} ({len(rendered.manifests)} objects)\n")


@app.command("chart-files")
def chart_files(
    chart: Path | None = typer.Option(None, "--chart", help="Chart directory.", metavar="DIR"),
) -> None:
    """Regenerate the chart's values.schema.json, default config and README.md."""
    from lensemble.render.chart_files import regenerate
    from lensemble.render.k8s import chart_dir

    for path in regenerate(chart_dir(chart)):
        typer.echo(f"wrote {path}")
