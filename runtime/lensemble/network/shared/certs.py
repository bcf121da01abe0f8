"""Development certificates: a CA, the coordinator's server certificate, one per participant.

Layout (``docs/architecture.md``, "Certificates")::

    DIR/ca.crt, DIR/ca.key                       the development CA (ca.key stays out of containers)
    DIR/coordinator/tls.crt, tls.key, ca.crt     server certificate, SANs = the coordinator's names
    DIR/<participant-id>/tls.crt, tls.key, ca.crt  client certificate, CN and DNS SAN = the id

Each identity folder is what one process mounts at ``/etc/lensemble/tls``. Keys are ECDSA P-256,
written with mode 0600. An existing CA in ``DIR`` is reused while it stays valid for more than
``network.tls.expiry_warning_days``, so certificates issued earlier stay valid; an expired or
expiring CA is replaced. Identity folders are (re)issued on every call, never valid beyond their
CA. Everything uses the ``cryptography`` library; these certificates are for development and
tests, production brings its own PKI (cert-manager or an organisation CA) in the same layout.

Writing is hostile-folder safe: folders are created 0700 (an identity folder that is a symbolic
link is refused), each file is written to a fresh exclusively created temporary file (random
name, ``O_EXCL | O_NOFOLLOW``, so a planted symbolic link is never followed), flushed to disk
and renamed over the target (a rename replaces a link, it never writes through it).

:func:`check_validity` is the start-up check of every process: an expired (or not yet valid)
certificate or CA is refused, one about to expire is reported.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from lensemble.config import LensembleConfig
from lensemble.durable import atomic_write
from lensemble.errors import ConfigError, UsageError
from lensemble.network.shared.identity import COORDINATOR_IDENTITY, identity_path

VALID_DAYS = 365
#: How far back development certificates start (their notBefore): a process whose clock is
#: behind the issuing machine's by less than this accepts them (a laptop and a VM that drifted,
#: a container host without NTP). Five minutes was too little (issue 41).
CLOCK_SKEW = dt.timedelta(days=1)
#: Default of ``network.tls.expiry_warning_days`` for callers without a config (days).
RENEW_WITHIN_DAYS = 30
_PEM = serialization.Encoding.PEM


@dataclass(frozen=True)
class IssuedCertificates:
    """What :func:`init_certs` wrote.

    Attributes:
        root: The output folder.
        ca_reused: True when an existing CA in ``root`` signed the new certificates.
        server_names: SANs of the coordinator's certificate.
        identities: Identity folders written (``coordinator`` and every participant id).
        ca_replaced: Why an existing CA was replaced (expired or expiring, one phrase), else
            None.
        ca_expires: When the CA that signed everything expires (UTC).
    """

    root: Path
    ca_reused: bool
    server_names: list[str]
    identities: list[str]
    ca_replaced: str | None = None
    ca_expires: dt.datetime | None = None


def coordinator_names(config: LensembleConfig, extra_hosts: Iterable[str] = ()) -> list[str]:
    """SANs of the coordinator's certificate, in order, without duplicates.

    ``network.host``, ``coordinator``, ``<run.name>-coordinator``, ``localhost``, ``127.0.0.1``,
    then every extra host (``--host``).
    """
    names = [
        config.network.host,
        COORDINATOR_IDENTITY,
        f"{config.run.name}-coordinator",
        "localhost",
        "127.0.0.1",
        *extra_hosts,
    ]
    return list(dict.fromkeys(n for n in names if n))


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(_PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _private_dir(path: Path, *, own: bool) -> None:
    """Create ``path`` with mode 0700; an identity folder (``own``) must be a real folder.

    Raises:
        UsageError: ``path`` is a symbolic link or not a folder.
    """
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    except OSError as exc:
        raise UsageError(
            f"cannot create the certificate folder {path} ({exc.strerror});",
            remediation="choose a folder you can write.",
        ) from None
    info = os.lstat(path)
    if own and (stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode)):
        raise UsageError(
            f"{path} is a symbolic link or not a folder, refusing to write keys through it;",
            remediation="remove it; certs init creates its identity folders itself.",
        )
    if own and info.st_mode & 0o077:
        os.chmod(path, 0o700, follow_symlinks=False)


def _write(path: Path, data: bytes, *, secret: bool = False) -> None:
    # fsync'd file and folder; a full disk is one sentence and leaves no temporary file.
    atomic_write(path, data, mode=0o600 if secret else 0o644)


def _builder(  # type: ignore[no-untyped-def]
    subject: str,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    days: int,
    *,
    not_after: dt.datetime | None = None,
    not_before: dt.datetime | None = None,
):
    now = dt.datetime.now(dt.UTC)
    end = now + dt.timedelta(days=days)
    start = now - CLOCK_SKEW  # backdated for clocks behind this one
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start if not_before is None else max(start, not_before))
        .not_valid_after(end if not_after is None else min(end, not_after))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def _new_ca(run_name: str, days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{run_name} development CA")])
    cert = (
        _builder(f"{run_name} development CA", name, key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _load_ca(root: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate] | None:
    cert_path, key_path = root / "ca.crt", root / "ca.key"
    if not (cert_path.exists() and key_path.exists()):
        return None
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except ValueError as exc:
        raise UsageError(
            f"{root}/ca.crt or ca.key cannot be read ({exc});",
            remediation="delete both files to create a new development CA.",
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise UsageError(
            f"{root}/ca.key is not an ECDSA key;",
            remediation="delete ca.crt and ca.key to create a new development CA.",
        )
    return key, cert


def _issue(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    *,
    common_name: str,
    sans: Sequence[str],
    usage: x509.ObjectIdentifier,
    days: int,
) -> tuple[bytes, bytes]:
    key = _new_key()
    cert = (
        _builder(
            common_name,
            ca_cert.subject,
            key.public_key(),
            days,
            not_after=ca_cert.not_valid_after_utc,
            not_before=ca_cert.not_valid_before_utc,  # never valid outside its CA's validity
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in sans]), False)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(_PEM), _key_pem(key)


def _stale_reason(cert: x509.Certificate, renew_within_days: int, now: dt.datetime) -> str | None:
    """Why ``cert`` should be replaced now (one phrase), or None while it stays usable."""
    end = cert.not_valid_after_utc
    if end <= now:
        return f"it expired on {end:%Y-%m-%d}"
    if cert.not_valid_before_utc > now:
        return f"it is not valid before {cert.not_valid_before_utc:%Y-%m-%d}"
    if end <= now + dt.timedelta(days=renew_within_days):
        return f"it expires on {end:%Y-%m-%d}, within {renew_within_days} days"
    return None


def init_certs(
    root: Path,
    config: LensembleConfig,
    hosts: Iterable[str] = (),
    *,
    days: int = VALID_DAYS,
    renew_within_days: int | None = None,
) -> IssuedCertificates:
    """Create (or reuse) a development CA and issue every identity's certificate.

    An existing CA is reused while it is valid for more than ``renew_within_days``; otherwise a
    new CA replaces it (certificates issued by the old one stop verifying, as they would have
    anyway). Leaf certificates never outlive their CA.

    Args:
        root: Output folder (created 0700).
        config: The run's config: ``network.host``, ``run.name``, the participant ids and
            ``network.tls.expiry_warning_days``.
        hosts: Extra host names or IP addresses for the coordinator's certificate.
        days: Validity of new certificates (days).
        renew_within_days: Replace a CA expiring within this many days (default: the config's
            ``network.tls.expiry_warning_days``).

    Returns:
        What was written.

    Raises:
        UsageError: An existing ``ca.crt``/``ca.key`` in ``root`` cannot be used, or an identity
            folder is a symbolic link.
    """
    margin = (
        config.network.tls.expiry_warning_days if renew_within_days is None else renew_within_days
    )
    if days <= margin:
        raise UsageError(
            f"certificates valid for {days} days would already be due for renewal "
            f"(network.tls.expiry_warning_days is {margin});",
            remediation="issue them for longer or lower network.tls.expiry_warning_days.",
        )
    server_names = coordinator_names(config, hosts)
    issued = [(COORDINATOR_IDENTITY, COORDINATOR_IDENTITY, server_names, True)]
    issued += [(pid, pid, [pid], False) for pid in config.participant_ids]
    _private_dir(root, own=False)
    for folder, *_ in issued:  # every folder checked before anything is written
        _private_dir(root / folder, own=True)
    loaded = _load_ca(root)
    replaced = None
    if loaded is not None:
        replaced = _stale_reason(loaded[1], margin, dt.datetime.now(dt.UTC))
        if replaced is not None:
            loaded = None
    ca_key, ca_cert = loaded if loaded is not None else _new_ca(config.run.name, days)
    ca_pem = ca_cert.public_bytes(_PEM)
    if loaded is None:
        _write(root / "ca.key", _key_pem(ca_key), secret=True)
        _write(root / "ca.crt", ca_pem)
    for folder, common_name, sans, server in issued:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        cert_pem, key_pem = _issue(
            ca_key, ca_cert, common_name=common_name, sans=sans, usage=usage, days=days
        )
        _write(root / folder / "tls.key", key_pem, secret=True)
        _write(root / folder / "tls.crt", cert_pem)
        _write(root / folder / "ca.crt", ca_pem)
    return IssuedCertificates(
        root=root,
        ca_reused=loaded is not None,
        server_names=server_names,
        identities=[i[0] for i in issued],
        ca_replaced=replaced,
        ca_expires=ca_cert.not_valid_after_utc,
    )


def certificate_identities(pem: bytes) -> set[str]:
    """Names a certificate vouches for: its subject CN and its DNS and IP SANs.

    Raises:
        ValueError: ``pem`` is not a PEM certificate.
    """
    cert = x509.load_pem_x509_certificate(pem)
    names = {str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)}
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return names
    names.update(san.get_values_for_type(x509.DNSName))
    names.update(str(ip) for ip in san.get_values_for_type(x509.IPAddress))
    return names


def check_own_certificate(path: Path, identity: str) -> None:
    """Refuse to start with a certificate issued to someone else.

    Args:
        path: This process's certificate (``network.tls.cert_file`` resolved).
        identity: The participant id this process runs as.

    Raises:
        ConfigError: The certificate's CN and SANs do not include ``identity``.
    """
    try:
        names = certificate_identities(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"network.tls.cert_file: {path} is not a readable PEM certificate ({exc}); run "
            "`lensemble certs init DIR --config FILE` for a development set."
        ) from None
    if identity not in names:
        raise ConfigError(
            f"network.tls.cert_file: {path} is issued to {', '.join(sorted(names))}, not to "
            f"participant '{identity}'; mount that participant's own certificate."
        )


def check_validity(
    path: Path, field: str, *, warn_within_days: int, now: dt.datetime | None = None
) -> list[str]:
    """Refuse expired certificates in a PEM file; report those about to expire.

    Every certificate in the file is checked (a chain, or a CA bundle).

    Args:
        path: The PEM file (``network.tls.cert_file`` or ``ca_file``, resolved).
        field: The config field it comes from, for messages (``cert_file``, ``ca_file``).
        warn_within_days: ``network.tls.expiry_warning_days``.
        now: The current time (UTC); for tests.

    Returns:
        One warning sentence per certificate expiring within ``warn_within_days``.

    Raises:
        ConfigError: The file is unreadable, holds no certificate, or one of its certificates
            has expired or is not valid yet (one sentence naming the field, file, date and fix).
    """
    now = now or dt.datetime.now(dt.UTC)
    try:
        certs = x509.load_pem_x509_certificates(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"network.tls.{field}: {path} is not a readable PEM certificate ({exc}); run "
            "`lensemble certs init DIR --config FILE` for a development set."
        ) from None
    fix = "renew it (`lensemble certs init DIR --config FILE` renews a development set)"
    warnings = []
    for cert in certs:
        names = ", ".join(sorted(certificate_identities(cert.public_bytes(_PEM))))
        start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
        if end <= now:
            days = (now - end).days
            raise ConfigError(
                f"network.tls.{field}: the certificate of {names} in {path} expired on "
                f"{end:%Y-%m-%d %H:%M} UTC ({days} days ago); {fix}."
            )
        if start > now:
            raise ConfigError(
                f"network.tls.{field}: the certificate of {names} in {path} is not valid before "
                f"{start:%Y-%m-%d %H:%M} UTC; check this machine's clock or reissue it."
            )
        if end <= now + dt.timedelta(days=warn_within_days):
            warnings.append(
                f"network.tls.{field}: the certificate of {names} in {path} expires on "
                f"{end:%Y-%m-%d %H:%M} UTC, in {(end - now).days} days; {fix} before then."
            )
    return warnings


def check_tls_files(config: LensembleConfig, identity: str) -> list[str]:
    """Start-up check of this process's own certificate and its CA bundle.

    Args:
        config: The run's config (``network.tls``).
        identity: ``coordinator`` or the participant id (fills ``{identity}``).

    Returns:
        Warnings for certificates expiring within ``network.tls.expiry_warning_days``; empty
        when TLS is off.

    Raises:
        ConfigError: A certificate or CA has expired, is not yet valid or cannot be read.
    """
    tls = config.network.tls
    if not tls.enabled:
        return []
    warnings = []
    for field, template in (("cert_file", tls.cert_file), ("ca_file", tls.ca_file)):
        path = identity_path(template, identity)
        if path is not None:
            warnings += check_validity(Path(path), field, warn_within_days=tls.expiry_warning_days)
    return warnings
