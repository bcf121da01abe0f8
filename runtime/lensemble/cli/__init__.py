"""The ``lensemble`` command line.

Each command group lives in its own module and imports its heavy dependencies (torch, grpc,
Helm) inside the command, so ``lensemble --help`` and ``lensemble config ...`` stay fast and
never import torch, and a base install (no ``[train]`` extra) can run every command that does not
train: a command that does says which extra to install (:mod:`lensemble.extras`).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

from lensemble import __version__
from lensemble.cli import (
    config_cmd,
    image_cmd,
    network_cmd,
    render_cmd,
    simulate_cmd,
    stack_cmd,
    verify_cmd,
)
from lensemble.cli.help_text import keep_words_whole
from lensemble.cli.output import report_error
from lensemble.durable import disk_error
from lensemble.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, LensembleError, UsageError
from lensemble.extras import missing_extra
from lensemble.machinery.allocator import keep_freed_buffers
from lensemble.machinery.hugepages import enable_for_this_process

keep_words_whole()  # before any help is formatted

app = typer.Typer(
    name="lensemble",
    help="Federated world-model training across sovereign participants (DiLoCo), from one "
    "validated config to simulation, Compose, Kubernetes and Pulumi.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.add_typer(config_cmd.app, name="config")
app.add_typer(render_cmd.app, name="render")
app.command(name="simulate")(simulate_cmd.simulate)
app.command(name="verify")(verify_cmd.verify)
app.add_typer(stack_cmd.app)
app.add_typer(image_cmd.app, name="image")
app.add_typer(network_cmd.app)


#: Former commands that became development tools of the source checkout (``tools/``).
MOVED_TO_CHECKOUT = {
    "vendor": "manages third_party/ of a source checkout",
    "kind": "builds the image, chart and overlays of a source checkout into a kind cluster",
}


def _moved(name: str, what: str) -> None:
    def moved(ctx: typer.Context) -> None:
        raise UsageError(
            f"`lensemble {name}` left the installed package: it {what};",
            remediation=f"run `{shlex.join(['python', '-m', f'tools.{name}', *ctx.args])}` from "
            "the repository root.",
        )

    moved.__doc__ = f"Point the former ``lensemble {name}`` at ``python -m tools.{name}``."
    app.command(
        name,
        hidden=True,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(moved)


for _name, _what in MOVED_TO_CHECKOUT.items():
    _moved(_name, _what)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"lensemble {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Federated world-model training across sovereign participants."""


def main() -> None:
    """Console entry point: run the app and turn Lensemble errors into exit codes."""
    enable_for_this_process()  # before any command imports torch
    keep_freed_buffers()
    try:
        app()
    except LensembleError as exc:
        report_error(exc)
        sys.exit(exc.exit_code)
    except ModuleNotFoundError as exc:
        # A library of an optional extra that this install lacks (torch on a base install):
        # the user's install, not our bug. Any other missing module keeps its traceback.
        missing = missing_extra(exc)
        if missing is None:
            raise
        report_error(missing)
        sys.exit(missing.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(EXIT_INTERRUPTED)
    except OSError as exc:
        # A path the user gave (-o, --output-dir, a certs folder) that cannot be used: their
        # input, not our bug. Errors without a file name are ours and keep their traceback.
        if exc.filename is None:
            raise
        full = disk_error(exc, Path(exc.filename).parent, None)
        if full is not None:  # a write path outside lensemble.durable met a full disk
            report_error(full)
            sys.exit(full.exit_code)
        report_error(
            UsageError(
                f"cannot use {exc.filename}: {exc.strerror or exc};",
                remediation="check that the path exists, is the right kind (file or folder) and is "
                "writable, or pass another one.",
            )
        )
        sys.exit(EXIT_BAD_INPUT)
