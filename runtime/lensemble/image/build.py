"""``lensemble image build``: the one Dockerfile, built from a staged, minimal context.

The context handed to the builder is a fresh folder holding exactly what the image needs
(``Dockerfile``, ``pyproject.toml``, ``README.md``, ``constraints.txt``, the build stage's pip
wrapper ``image/pip``, ``runtime/``) plus an optional ``wheelhouse/`` of local wheels:
nothing else of the checkout (certificates, run output, virtual environments) can reach the
builder. Options that must not end up in the image travel
the BuildKit way: the wheelhouse is bind-mounted into the install steps, and an extra CA bundle
is a build secret (``--secret id=ca-bundle``), so neither is written to any layer of the final
image.

Tags: ``lensemble:<version>-<torch line>`` and, for a checkout without uncommitted changes,
``lensemble:sha-<7 hex>``. Labels: the OCI labels of the Dockerfile, plus
:data:`~lensemble.image.CONTEXT_DIGEST_LABEL`, the digest of the staged context (see
:func:`context_digest`), which tells an image built from this tree from a stale one.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from lensemble.errors import ToolMissing, UsageError
from lensemble.image import CONTEXT_DIGEST_LABEL, IMAGE_REPOSITORY, ImageBuildFailed, image_tag
from lensemble.image.client import BuildClient, image_size

#: What the Dockerfile copies, relative to the source tree (files, then folders).
CONTEXT_FILES = (
    "Dockerfile",
    "pyproject.toml",
    "README.md",
    "constraints.txt",
    "image/pip",
)
CONTEXT_DIRS = ("runtime",)
WHEELHOUSE = "wheelhouse"
#: Seconds a whole image build may take (docs/performance.md#images-and-the-compose-stack).
BUILD_TIMEOUT_S = 3600.0
#: Lines of the build output kept to explain a failure.
_TAIL = 40

Echo = Callable[[str], None]


@dataclass(frozen=True)
class BuiltImage:
    """An image ``lensemble image build`` made.

    Attributes:
        tags: Every tag given to it; the first is ``lensemble:<version>-<line>``.
        context_digest: Digest of the staged context (``sha256:<hex>``).
        seconds: Wall seconds of the build.
        size_bytes: Image size as the engine reports it (bytes).
    """

    tags: list[str]
    context_digest: str
    seconds: float
    size_bytes: int


def find_source_tree(start: Path) -> Path:
    """The source checkout holding the Dockerfile: ``start`` or one of its parents.

    Raises:
        UsageError: No folder from ``start`` upwards has a Dockerfile and ``runtime/lensemble``.
    """
    for folder in (start, *start.parents):
        if (folder / "Dockerfile").is_file() and (folder / "runtime" / "lensemble").is_dir():
            return folder
    raise UsageError(
        f"{start} is not inside a Lensemble source checkout (no Dockerfile with runtime/lensemble "
        "next to it);",
        remediation="run from the checkout, or pass --context with its path.",
    )


def _context_paths(source: Path) -> list[Path]:
    """Every file the image is built from, relative to ``source``, sorted."""
    missing = [name for name in CONTEXT_FILES if not (source / name).is_file()]
    if missing:
        raise UsageError(
            f"{source} lacks {', '.join(missing)}, so it is not a complete source checkout;",
            remediation="pass --context with the repository root.",
        )
    paths = [Path(name) for name in CONTEXT_FILES]
    for folder in CONTEXT_DIRS:
        for path in (source / folder).rglob("*"):
            rel = path.relative_to(source)
            if path.is_file() and not _build_output(rel):
                paths.append(rel)
    return sorted(paths)


def _build_output(rel: Path) -> bool:
    """Bytecode and packaging metadata that a local install leaves in the source tree."""
    in_output = any(part == "__pycache__" or part.endswith(".egg-info") for part in rel.parts)
    return in_output or rel.suffix in (".pyc", ".pyo")


def context_digest(source: Path) -> str:
    """SHA-256 over the names and bytes of every file the image is built from.

    Wheelhouse and CA bundle are not part of it: they change where packages come from, not
    what the image holds (every version is pinned by ``constraints.txt``).

    Returns:
        ``sha256:<64 hex>``.

    Raises:
        UsageError: ``source`` is not a complete source checkout.
    """
    digest = hashlib.sha256()
    for rel in _context_paths(source):
        data = (source / rel).read_bytes()
        digest.update(f"{rel.as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    return f"sha256:{digest.hexdigest()}"


def stage_context(source: Path, target: Path, wheelhouse: Path | None) -> None:
    """Copy what the image needs into ``target`` (an empty folder), wheels hard-linked.

    Args:
        source: The source checkout.
        target: The staged context (must exist and be empty).
        wheelhouse: Folder of ``*.whl`` files pip may take before the index, or None.

    Raises:
        UsageError: ``source`` is incomplete, or ``wheelhouse`` is not a folder of wheels.
    """
    for rel in _context_paths(source):
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / rel, target / rel)
    if wheelhouse is None:
        return
    wheels = sorted(wheelhouse.glob("*.whl")) if wheelhouse.is_dir() else []
    if not wheels:
        raise UsageError(
            f"--wheelhouse {wheelhouse} is not a folder holding wheels (*.whl);",
            remediation="pass the folder pip downloads wheels into (`pip config list` shows a "
            "find-links folder), or leave --wheelhouse out to use the indexes.",
        )
    (target / WHEELHOUSE).mkdir()
    for wheel in wheels:
        dest = target / WHEELHOUSE / wheel.name
        try:
            os.link(wheel, dest)
        except OSError:  # another file system: copy instead
            shutil.copy2(wheel, dest)


def git_revision(source: Path) -> tuple[str, bool]:
    """The checkout's commit and whether its tracked files are clean (``unknown`` outside git)."""
    try:
        head = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if head.returncode != 0:
            return "unknown", False
        status = subprocess.run(
            ["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError:
        return "unknown", False
    return head.stdout.strip(), status.returncode == 0 and not status.stdout.strip()


def build_command(
    client: BuildClient,
    context: Path,
    *,
    tags: Sequence[str],
    base: str | None,
    torch_cuda: str,
    version: str,
    revision: str,
    digest: str,
    ca_bundle: Path | None,
    pip_index_url: str | None,
    torch_index_url: str | None,
) -> list[str]:
    """The full build command line (see the Dockerfile's header for each option)."""
    args = [*client.build, "--progress=plain"]
    for tag in tags:
        args += ["--tag", tag]
    build_args = {
        "BASE_IMAGE": base,
        "TORCH_CUDA": torch_cuda,
        "VERSION": version,
        "REVISION": revision,
        "PIP_INDEX_URL": pip_index_url,
        "TORCH_INDEX_URL": torch_index_url,
    }
    for key, value in build_args.items():
        if value:
            args += ["--build-arg", f"{key}={value}"]
    args += ["--label", f"{CONTEXT_DIGEST_LABEL}={digest}"]
    if ca_bundle is not None:
        args += ["--secret", f"id=ca-bundle,src={ca_bundle}"]
    return [*args, str(context)]


def explain_failure(lines: Iterable[str], base: str | None) -> tuple[str, str]:
    """One sentence and a fix for a failed build, from the last lines of its output.

    The reason quoted is the first line a tool inside the build marked as its own error (pip's
    ``ERROR: ...``), else the builder's last error line: BuildKit's own last line only says
    which step exited non-zero, not why.
    """
    tail = [line.strip() for line in lines if line.strip()]
    text = "\n".join(tail).lower()
    errors = [line for line in tail if "error" in line.lower()]
    inner = [line for line in errors if _INNER_ERROR.search(line)]
    reason = inner[0] if inner else errors[-1] if errors else (tail[-1] if tail else "no output")
    for cause in _KNOWN_CAUSES:
        if any(needle in text for needle in cause.needles):
            message = cause.message.format(base=base or _DEFAULT_BASE, reason=reason)
            return message, cause.remediation
    return (f"The image build failed: {reason}", "The build's last lines are above (stderr).")


@dataclass(frozen=True)
class _Cause:
    """A known cause of a failed build: words of the output, the sentence and the fix."""

    needles: tuple[str, ...]
    message: str
    remediation: str


_DEFAULT_BASE = "of the Dockerfile's default (a registry image)"
#: A tool's own error line inside a build step (``#10 3.21 ERROR: ...``), not BuildKit's.
_INNER_ERROR = re.compile(r"^#\d+ \d+(\.\d+)? (error|fatal)\b", re.IGNORECASE)
#: First match wins.
_KNOWN_CAUSES = (
    _Cause(
        ("failed to resolve source metadata", "pull access denied", "failed to do request"),
        "The builder could not fetch the base image {base} (no registry reachable, or no such "
        "image).",
        "Build a base without a registry with `lensemble image base` and pass "
        "--base lensemble-base:bookworm.",
    ),
    _Cause(
        ("no space left on device",),
        "The disk the Docker engine writes to is full: {reason}",
        "Free space under the engine's data root (`docker system df`, then "
        "`docker builder prune`) and build again.",
    ),
    _Cause(
        ("certificate_verify_failed", "certificate verify failed"),
        "pip inside the build could not verify the package index's TLS certificate.",
        "Pass the CA bundle of your proxy with --ca-bundle FILE (e.g. "
        "/etc/ssl/certs/ca-certificates.crt).",
    ),
    _Cause(
        (
            "temporary failure in name resolution",
            "name or service not known",
            "max retries exceeded",
            "connection refused",
            "network is unreachable",
            "read timed out",
        ),
        "pip inside the build could not reach the package index: {reason}",
        "Check that containers on this engine reach the index (DNS and proxy), or pass a "
        "mirror with --index-url URL.",
    ),
)


def image_tags(
    version: str,
    torch_cuda: str,
    revision: str,
    *,
    clean: bool,
    extra: Sequence[str] = (),
    echo: Echo = print,
) -> list[str]:
    """Tags of a build: ``lensemble:<version>-<line>``, ``sha-<7 hex>`` of a clean checkout, extra.

    Args:
        version: The package version.
        torch_cuda: Torch line (``cpu``, ``cu126``, ...).
        revision: The checkout's commit, or ``unknown`` outside git.
        clean: Whether its tracked files are unchanged (only then is ``sha-`` tagged).
        extra: More tags, each kept once.
        echo: Says why a known commit is not tagged.
    """
    tags = [image_tag(version, torch_cuda)]
    if clean and revision != "unknown":
        tags.append(f"{IMAGE_REPOSITORY}:sha-{revision[:7]}")
    elif revision != "unknown":
        echo(f"not tagging sha-{revision[:7]}: the checkout has uncommitted changes")
    return tags + [t for t in extra if t not in tags]


def build_image(
    client: BuildClient,
    source: Path,
    *,
    version: str,
    base: str | None = None,
    torch_cuda: str = "cpu",
    wheelhouse: Path | None = None,
    ca_bundle: Path | None = None,
    pip_index_url: str | None = None,
    torch_index_url: str | None = None,
    extra_tags: Sequence[str] = (),
    echo: Echo = print,
    log: Echo | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> BuiltImage:
    """Build Lensemble's image from the source checkout ``source``.

    Args:
        client: The BuildKit-capable client (:func:`lensemble.image.client.find_build_client`).
        source: The source checkout (see :func:`find_source_tree`).
        version: The package version (first tag ``lensemble:<version>-<torch_cuda>``).
        base: Base image (``BASE_IMAGE``); None keeps the Dockerfile's registry default.
        torch_cuda: Torch line: ``cpu``, ``cu126``, ``cu128``.
        wheelhouse: Folder of local wheels (a torch wheel is taken from it first).
        ca_bundle: Extra CA certificates (PEM) pip trusts during the build; never in a layer.
        pip_index_url: A Python package index mirror.
        torch_index_url: The torch index, when the wheelhouse has no torch wheel.
        extra_tags: More tags to give the image.
        echo: Prints progress and the summary.
        log: Receives every line of the builder's output (default: dropped, kept for errors).
        clock: Monotonic clock (seconds).

    Returns:
        The tags, context digest, build seconds and image size.

    Raises:
        UsageError: Bad ``source``, ``wheelhouse`` or ``ca_bundle``.
        ToolMissing: The client cannot be run.
        ImageBuildFailed: The build failed; the message names the cause when it is a
            known one (base not reachable, TLS interception without ``ca_bundle``).
    """
    if ca_bundle is not None and not ca_bundle.is_file():
        raise UsageError(
            f"--ca-bundle {ca_bundle} is not a file;",
            remediation="pass a PEM file of CA certificates, e.g. "
            "/etc/ssl/certs/ca-certificates.crt.",
        )
    digest = context_digest(source)
    revision, clean = git_revision(source)
    tags = image_tags(version, torch_cuda, revision, clean=clean, extra=extra_tags, echo=echo)
    with tempfile.TemporaryDirectory(prefix="lensemble-image-") as tmp:
        context = Path(tmp)
        stage_context(source, context, wheelhouse)
        args = build_command(
            client,
            context,
            tags=tags,
            base=base,
            torch_cuda=torch_cuda,
            version=version,
            revision=revision,
            digest=digest,
            ca_bundle=ca_bundle,
            pip_index_url=pip_index_url,
            torch_index_url=torch_index_url,
        )
        echo(f"building {', '.join(tags)} on {base or 'the default base'} (BuildKit)")
        start = clock()
        code, tail = _stream(args, {**os.environ, **client.env}, log)
        seconds = clock() - start
    if code != 0:
        if log is None:  # nothing was streamed: show what explains the failure
            for line in tail:
                print(line, file=sys.stderr)
        message, remediation = explain_failure(tail, base)
        raise ImageBuildFailed(message, remediation=remediation)
    size = image_size(client.docker, tags[0])
    echo(f"built {', '.join(tags)}: {size / 1e9:.2f} GB in {seconds:.0f} s")
    return BuiltImage(tags=tags, context_digest=digest, seconds=seconds, size_bytes=size)


def _stream(args: list[str], env: dict[str, str], log: Echo | None) -> tuple[int, list[str]]:
    """Run the build, handing each output line to ``log``; its exit code and last lines."""
    tail: deque[str] = deque(maxlen=_TAIL)
    try:
        proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
    except OSError as exc:
        raise ToolMissing(
            f"Could not run `{args[0]}`: {exc.strerror or exc}.",
            remediation="Install Docker or pass --docker with a working client.",
        ) from None
    assert proc.stdout is not None  # guaranteed by stdout=PIPE
    deadline = time.monotonic() + BUILD_TIMEOUT_S
    with proc:
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            if log is not None:
                log(line.rstrip("\n"))
            if time.monotonic() > deadline:
                proc.kill()
                raise ImageBuildFailed(
                    f"The image build did not finish within {BUILD_TIMEOUT_S:.0f} s.",
                    remediation="Check the engine (`docker info`) and the network to the index.",
                )
        code = proc.wait()
    return code, list(tail)
