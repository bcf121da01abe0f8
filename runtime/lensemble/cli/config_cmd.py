"""``lensemble config``: validate, show, diff and export the schema of a config."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from lensemble.cli.options import OutputFileOption, SetOption, load

if TYPE_CHECKING:
    from lensemble.config import LensembleConfig
from lensemble.cli.output import emit

app = typer.Typer(
    help="Validate, show and compare configs; export the JSON Schema.", no_args_is_help=True
)


@app.command()
def validate(
    file: Path = typer.Argument(..., help="Config file to validate.", metavar="FILE"),
    set_: list[str] = SetOption,
) -> None:
    """Validate FILE; print one summary line, or one line per problem (exit 2)."""
    from lensemble.config import config_hash

    cfg = load(file, set_)
    fed = cfg.federation
    typer.echo(
        f"ok {file}: environment={cfg.deployment.environment} "
        f"participants={len(fed.participants)} transport={fed.transport} rounds={fed.rounds} "
        f"quorum={fed.quorum} hash={config_hash(cfg)}"
    )


@app.command()
def show(
    file: Path = typer.Argument(..., help="Config file to resolve.", metavar="FILE"),
    set_: list[str] = SetOption,
) -> None:
    """Print the resolved config (every default filled in) as YAML, with its hash."""
    from lensemble.config import config_hash, dump_config

    cfg = load(file, set_)
    sys.stdout.write(f"# config hash: {config_hash(cfg)}\n")
    sys.stdout.write(dump_config(cfg))


@app.command()
def diff(
    a: Path = typer.Argument(..., help="First config file.", metavar="A"),
    b: Path = typer.Argument(..., help="Second config file.", metavar="B"),
    all_fields: bool = typer.Option(
        False, "--all", help="Compare every field, not only those the config hash covers."
    ),
) -> None:
    """List the fields that differ between A and B, with both values (exit 1 when any differ)."""
    from lensemble.config import config_hash
    from lensemble.config.hashing import differences, hashed_view

    cfg_a, cfg_b = load(a, []), load(b, [])

    def view(cfg: LensembleConfig) -> dict[str, object]:
        return cfg.model_dump(mode="json") if all_fields else hashed_view(cfg)

    rows = differences(view(cfg_a), view(cfg_b))
    for path, value_a, value_b in rows:
        typer.echo(f"{path}: {json.dumps(value_a)} -> {json.dumps(value_b)}")
    if not rows:
        typer.echo(f"same: {config_hash(cfg_a)}")
    raise typer.Exit(1 if rows else 0)


@app.command()
def schema(
    output: Path | None = OutputFileOption,
) -> None:
    """Print the config's JSON Schema (draft 2020-12)."""
    from lensemble.config.schema_export import json_schema_text

    text = json_schema_text()
    emit(text, output)


@app.command()
def reference(
    output: Path | None = OutputFileOption,
) -> None:
    """Print the field reference (Markdown) generated from the schema."""
    from lensemble.config.reference import render_reference

    text = render_reference()
    emit(text, output)
