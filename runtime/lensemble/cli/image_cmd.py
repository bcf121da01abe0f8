"""``lensemble image base`` and ``lensemble image build``: the container image, registry-free."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer

app = typer.Typer(
    help="Build the container image, with or without a container registry.",
    no_args_is_help=True,
)


class TorchLine(StrEnum):
    """Torch builds the image can carry (one tag per line)."""

    cpu = "cpu"
    cu126 = "cu126"
    cu128 = "cu128"


DockerOption = typer.Option(
    None,
    "--docker",
    help="The docker client to use (default: the first on PATH that can build with BuildKit).",
    metavar="PATH",
)


@app.command()
def base(
    tag: str = typer.Option(
        "lensemble-base:bookworm", "--tag", "-t", help="Tag of the imported base image."
    ),
    suite: str = typer.Option("bookworm", "--suite", help="Debian suite (Python 3.11)."),
    mirror: str | None = typer.Option(
        None,
        "--mirror",
        help="apt mirror URI (default: the host's configured Debian mirror, else deb.debian.org).",
        metavar="URI",
    ),
    snapshot: str | None = typer.Option(
        None,
        "--snapshot",
        help="Debian snapshot timestamp YYYYMMDDTHHMMSSZ, for a reproducible base "
        "(uses snapshot.debian.org).",
        metavar="TIMESTAMP",
    ),
    docker: str = typer.Option("docker", "--docker", help="The docker client.", metavar="PATH"),
    as_json: bool = typer.Option(False, "--json", help="One JSON summary line on stdout."),
) -> None:
    """Build a Debian base image from an apt mirror (mmdebstrap | docker import).

    For sites that reach no container registry; pass the tag to `lensemble image build --base`.
    """
    from lensemble.image.debian_base import build_base

    built = build_base(
        tag=tag, suite=suite, mirror=mirror, snapshot=snapshot, docker=docker, echo=_progress
    )
    _report(as_json, built.tag, asdict(built))


@app.command()
def build(
    base: str | None = typer.Option(
        None,
        "--base",
        help="Base image: a registry image, or one from `lensemble image base` "
        "(default: the Dockerfile's python:3.11 slim image from a registry).",
        metavar="IMAGE",
    ),
    torch_cuda: TorchLine = typer.Option(TorchLine.cpu, "--torch-cuda", help="Torch build line."),
    wheelhouse: Path | None = typer.Option(
        None,
        "--wheelhouse",
        help="Folder of local wheels pip takes first (e.g. the CPU torch wheel).",
        metavar="DIR",
    ),
    ca_bundle: Path | None = typer.Option(
        None,
        "--ca-bundle",
        help="Extra CA certificates (PEM) pip trusts during the build; never stored in the image.",
        metavar="FILE",
    ),
    index_url: str | None = typer.Option(
        None, "--index-url", help="Python package index mirror.", metavar="URL"
    ),
    torch_index_url: str | None = typer.Option(
        None,
        "--torch-index-url",
        help="Torch index when the wheelhouse has no torch wheel "
        "(default: download.pytorch.org/whl/<line>).",
        metavar="URL",
    ),
    tag: list[str] = typer.Option(
        [], "--tag", "-t", help="An extra tag (repeatable).", metavar="IMAGE:TAG"
    ),
    context: Path | None = typer.Option(
        None,
        "--context",
        help="The source checkout (default: the one holding the current folder).",
        metavar="DIR",
    ),
    docker: str | None = DockerOption,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Do not stream the build output."),
    as_json: bool = typer.Option(False, "--json", help="One JSON summary line on stdout."),
) -> None:
    """Build the one image (tags <version>-<line> and sha-<7 hex>) with BuildKit.

    Needs a source checkout. Without a registry: `lensemble image base`, then
    `lensemble image build --base lensemble-base:bookworm --wheelhouse DIR --ca-bundle FILE`.
    """
    from lensemble import __version__
    from lensemble.image.build import build_image, find_source_tree
    from lensemble.image.client import find_build_client

    source = find_source_tree((context or Path.cwd()).resolve())
    client = find_build_client(docker)
    built = build_image(
        client,
        source,
        version=__version__,
        base=base,
        torch_cuda=torch_cuda.value,
        wheelhouse=wheelhouse,
        ca_bundle=ca_bundle,
        pip_index_url=index_url,
        torch_index_url=torch_index_url,
        extra_tags=tag,
        echo=_progress,
        log=None if quiet else _progress,
    )
    _report(as_json, built.tags[0], asdict(built))


def _report(as_json: bool, text: str, summary: dict[str, Any]) -> None:
    """The result on stdout: one JSON line (seconds rounded to 0.1), or just ``text``."""
    if as_json:
        typer.echo(json.dumps({**summary, "seconds": round(summary["seconds"], 1)}))
    else:
        typer.echo(text)


def _progress(line: str) -> None:
    """Progress goes to stderr, so stdout carries only the result."""
    sys.stderr.write(line + "\n")
