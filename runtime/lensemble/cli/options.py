"""Options shared by the commands: the config, its overrides, and an output file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from lensemble.config import LensembleConfig

SET_HELP = "Override a config field, e.g. --set federation.rounds=5 (repeatable)."

SetOption = typer.Option(None, "--set", "-s", help=SET_HELP, metavar="PATH=VALUE")
ConfigOption = typer.Option(
    None, "--config", "-c", help="Config file (default: config/local.yaml).", metavar="FILE"
)
#: ``-o FILE`` of a command that otherwise prints its text (see :func:`lensemble.cli.output.emit`).
OutputFileOption = typer.Option(
    None, "--output", "-o", help="Write to this file instead of stdout.", metavar="FILE"
)


def load(path: Path | None, overrides: list[str] | None) -> LensembleConfig:
    """Load and validate a config with its overrides (raises ConfigError for the CLI)."""
    from lensemble.config import load_config

    return load_config(path, overrides or [])
