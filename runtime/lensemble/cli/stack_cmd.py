"""``lensemble up`` and ``lensemble down``: bring a rendered stack up, follow it, tear it down."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer

from lensemble.cli.options import ConfigOption, SetOption, load

app = typer.Typer()


class Substrate(StrEnum):
    """Substrates ``up`` can start."""

    compose = "compose"


class Profile(StrEnum):
    """Compose profiles."""

    cpu = "cpu"
    gpu = "gpu"


DirOption = typer.Option(
    None,
    "--dir",
    help="Folder for the rendered stack, its certificates and its record "
    "(default: <run.output_dir>/compose).",
    metavar="DIR",
)


@app.command()
def up(
    *,
    substrate: Substrate = typer.Option(
        Substrate.compose, "--substrate", help="Where to run the stack."
    ),
    config: Path | None = ConfigOption,
    set_: list[str] = SetOption,
    profile: Profile = typer.Option(Profile.cpu, "--profile", help="Compose profile."),
    stack_dir: Path | None = DirOption,
    ready_timeout: float | None = typer.Option(
        None,
        "--ready-timeout",
        help="Seconds to wait for every ready line (default: federation.join_timeout_s).",
        min=1.0,
    ),
    start_timeout: float | None = typer.Option(
        None,
        "--start-timeout",
        help="Seconds creating the containers may take, and then starting them (default 900; "
        "a slow storage driver such as vfs needs minutes).",
        min=1.0,
    ),
) -> None:
    """Render the stack, start it, wait for every ready line and follow the rounds.

    Exits 0 when the run finishes, else with the coordinator's exit code (1 run failed, 2 bad
    input, 3 failed closed) or 4 when Docker is missing. The stack stays up either way:
    `lensemble down` tears it down.
    """
    import shlex

    from lensemble.cli.output import require_folder
    from lensemble.config import default_config_path
    from lensemble.stack.compose_stack import START_TIMEOUT_S, stack_dir_for, up_compose
    from lensemble.stack.engine import check_engine, compose_command

    require_folder(stack_dir, "--dir")
    cfg = load(config, set_)
    path = str(config) if config is not None else str(default_config_path())
    source = shlex.join([path, *(arg for item in set_ or [] for arg in ("--set", item))])
    command = compose_command()
    check_engine()
    up_compose(
        cfg,
        stack_dir=stack_dir_for(cfg, stack_dir),
        profile=profile.value,
        command=command,
        source=source,
        ready_timeout_s=ready_timeout,
        start_timeout_s=start_timeout or START_TIMEOUT_S,
        echo=typer.echo,
    )


@app.command()
def down(
    config: Path | None = ConfigOption,
    set_: list[str] = SetOption,
    stack_dir: Path | None = DirOption,
    volumes: bool = typer.Option(
        False,
        "--volumes",
        help="Also delete the stack's volumes: checkpoints, ledger and participant data.",
    ),
) -> None:
    """Tear down the stack `lensemble up` started, exactly once."""
    from lensemble.stack.compose_stack import down_compose, stack_dir_for

    cfg = load(config, set_)
    down_compose(stack_dir_for(cfg, stack_dir), volumes=volumes, echo=typer.echo)
