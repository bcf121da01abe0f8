"""A small test PKI: a root, intermediates under it, and leaf certificates (ECDSA P-256).

It plays the cluster's certificate authorities for the chart tests: what cert-manager or an
organisation's CA would write into each identity's Secret, so that a rendered pod's TLS volume
can be laid out on disk and checked with the runtime's own peer-key check.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

_PEM = serialization.Encoding.PEM


@dataclass(frozen=True)
class Authority:
    """A CA: its key and certificate (PEM in ``pem``)."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def pem(self) -> bytes:
        """The CA certificate as PEM."""
        return self.cert.public_bytes(_PEM)


def _certificate(
    name: str, key: ec.EllipticCurvePrivateKey, issuer: Authority | None, *, ca: bool
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.cert.subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False
        )
    return builder.sign(issuer.key if issuer else key, hashes.SHA256())


def authority(name: str, parent: Authority | None = None) -> Authority:
    """A root CA (``parent`` None) or an intermediate CA issued by ``parent``."""
    key = ec.generate_private_key(ec.SECP256R1())
    return Authority(key, _certificate(name, key, parent, ca=True))


def issue(ca: Authority, name: str) -> dict[str, bytes]:
    """A leaf for ``name`` (CN and DNS SAN) as a ``kubernetes.io/tls`` Secret's data.

    ``ca.crt`` is the issuing CA, as cert-manager writes it for a CA issuer.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _certificate(name, key, ca, ca=False)
    return {
        "tls.crt": cert.public_bytes(_PEM),
        "tls.key": key.private_bytes(
            _PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        "ca.crt": ca.pem,
    }
