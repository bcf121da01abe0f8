"""The TLS folder a Compose stack mounts: created once with ``lensemble certs init``, made readable.

Each container mounts only its own identity folder; the CA key stays in the folder itself, which
no container mounts.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from lensemble.stack import StackFailed

#: Creates the certificates: ``(certs_dir, config_file)``.
MakeCerts = Callable[[Path, Path], None]


def run_certs_init(certs_dir: Path, config_file: Path) -> None:
    """Create the development CA and one key pair per identity with ``lensemble certs init``.

    Raises:
        StackFailed: The command failed.
    """
    args = [
        sys.executable,
        "-c",
        "from lensemble.cli import main; main()",
        "certs",
        "init",
        str(certs_dir),
        "--config",
        str(config_file),
    ]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        raise StackFailed(
            f"`lensemble certs init {certs_dir}` failed: {reason[-1]}",
            remediation="Create the certificates yourself with that command, then run again.",
        )


def prepare_certs(
    certs_dir: Path, config_file: Path, identities: Sequence[str], make_certs: MakeCerts
) -> None:
    """Make sure every identity has its TLS folder, readable by the containers' user.

    Creates the certificates when none exist. The containers run as UID 10001, not as the
    user who made the files, so each identity folder becomes world-readable while ``certs_dir``
    itself becomes ``0700``: other users on the host cannot reach into it, and the CA key in
    ``certs_dir`` (never mounted) keeps its own mode.

    Args:
        certs_dir: The folder ``lensemble certs init`` fills.
        config_file: The container config (its host names become certificate SANs).
        identities: ``coordinator`` and every participant id.
        make_certs: Creates the certificates (``certs_dir``, ``config_file``).

    Raises:
        StackFailed: Only some identities have certificates, or creating them failed.
    """

    def missing() -> list[str]:
        return [i for i in identities if not (certs_dir / i / "tls.crt").is_file()]

    absent = missing()
    if absent and len(absent) < len(identities):
        raise StackFailed(
            f"{certs_dir} has no certificates for {', '.join(absent)} but has some for others "
            "(the participants changed since it was made).",
            remediation=f"Delete {certs_dir} and run again to create a fresh set.",
        )
    if absent:
        make_certs(certs_dir, config_file)
        still = missing()
        if still:
            raise StackFailed(
                f"`lensemble certs init` left no certificate for {', '.join(still)} in "
                f"{certs_dir}.",
                remediation="Check the certificate layout in docs/architecture.md.",
            )
    certs_dir.chmod(0o700)
    for identity in identities:
        folder = certs_dir / identity
        folder.chmod(0o755)
        for item in folder.iterdir():
            if item.is_file():
                item.chmod(0o644)
