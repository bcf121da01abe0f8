"""TLS Secrets the chart mounts, made from a ``lensemble certs init``-style directory.

The chart mounts identity ``X``'s Secret ``<run.name>-X-tls`` (``tls.crt``, ``tls.key``,
``ca.crt``) at ``/etc/lensemble/tls/X/``. A stack given ``lensemble:tlsDir`` makes those Secrets
for the identities it deploys; private keys reach Pulumi only as secrets (encrypted in the
state). A participant stack puts the coordinator's CA into ``ca.crt``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from lensemble.errors import ConfigError, ConfigProblem


@dataclass(frozen=True)
class TlsIdentity:
    """One identity's TLS Secret (``kubernetes.io/tls`` plus ``ca.crt``).

    Attributes:
        secret_name: Secret name the chart mounts for this identity.
        certificate: PEM certificate.
        private_key: PEM private key (a Pulumi secret).
        ca_certificate: PEM CA that signs the peers.
    """

    secret_name: str
    certificate: str
    private_key: pulumi.Output[str]
    ca_certificate: pulumi.Input[str]


def read_identity(
    directory: Path,
    identity: str,
    secret_name: str,
    *,
    source: str,
    ca_certificate: pulumi.Input[str] | None = None,
) -> TlsIdentity:
    """Read ``DIR/<identity>/tls.crt``, ``tls.key`` and (unless given) ``ca.crt``.

    Args:
        directory: The certificate directory.
        identity: ``coordinator`` or a participant id.
        secret_name: Name of the Secret to make.
        source: Stack file, for error messages.
        ca_certificate: CA to write instead of the directory's ``ca.crt``.

    Raises:
        ConfigError: A file is missing or unreadable (naming ``lensemble:tlsDir`` and the file).
    """

    def read(name: str) -> str:
        path = directory / identity / name
        try:
            return path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                [
                    ConfigProblem(
                        "lensemble:tlsDir",
                        f"{path} cannot be read ({exc.strerror}); lay the directory out as "
                        "`lensemble certs init` does (<identity>/tls.crt, tls.key, ca.crt).",
                        source=source,
                    )
                ]
            ) from None

    return TlsIdentity(
        secret_name=secret_name,
        certificate=read("tls.crt"),
        private_key=pulumi.Output.secret(read("tls.key")),
        ca_certificate=ca_certificate if ca_certificate is not None else read("ca.crt"),
    )


def tls_secret(
    name: str,
    identity: TlsIdentity,
    namespace: str,
    labels: dict[str, str],
    opts: pulumi.ResourceOptions,
) -> k8s.core.v1.Secret:
    """The Secret of one identity in its namespace."""
    return k8s.core.v1.Secret(
        name,
        metadata=k8s.meta.v1.ObjectMetaArgs(
            name=identity.secret_name, namespace=namespace, labels=labels
        ),
        type="kubernetes.io/tls",
        string_data={
            "tls.crt": identity.certificate,
            "tls.key": identity.private_key,
            "ca.crt": identity.ca_certificate,
        },
        opts=opts,
    )
