"""``lensemble render``: deployment artifacts rendered from a config."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Render deployment artifacts (Compose, Helm values, Kubernetes manifests) from a config.",
    no_args_is_help=True,
)
