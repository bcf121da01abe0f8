"""Expired certificates are named as such: refused at start, renewed by ``certs init``.

On main a coordinator with a certificate that expired 35 days ago started silently, and
``certs init`` into a folder whose CA expired 5 days ago said "reused the CA" and issued leaf
certificates that failed ``openssl verify``.
"""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from lensemble.config.load import validate_mapping
from lensemble.errors import ConfigError
from lensemble.network.shared.certs import check_tls_files, check_validity, init_certs
from tests.support.cli import run_cli

NOW = dt.datetime.now(dt.UTC)
REPO = Path(__file__).resolve().parents[2]


def _config(root: Path, warning_days: int = 30):  # type: ignore[no-untyped-def]
    return validate_mapping(
        {
            "federation": {"participants": [{"id": "alpha"}, {"id": "bravo"}]},
            "network": {
                "tls": {
                    "ca_file": str(root / "{identity}" / "ca.crt"),
                    "cert_file": str(root / "{identity}" / "tls.crt"),
                    "key_file": str(root / "{identity}" / "tls.key"),
                    "expiry_warning_days": warning_days,
                }
            },
        }
    )


def write_ca(root: Path, *, not_before: dt.datetime, not_after: dt.datetime) -> x509.Certificate:
    """A CA valid from ``not_before`` to ``not_after``, as ``root/ca.crt`` and ``root/ca.key``."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "old development CA")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    root.mkdir(parents=True, exist_ok=True)
    (root / "ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (root / "ca.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert


def _leaf(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _verifies(root: Path, identity: str) -> None:
    ca, leaf = _leaf(root / "ca.crt"), _leaf(root / identity / "tls.crt")
    leaf.verify_directly_issued_by(ca)
    now = dt.datetime.now(dt.UTC)  # not NOW: the test may run long after this file was imported
    for cert in (ca, leaf):
        assert cert.not_valid_before_utc <= now + dt.timedelta(minutes=1)
        assert cert.not_valid_after_utc > now
    assert leaf.not_valid_after_utc <= ca.not_valid_after_utc


def test_certs_init_renews_a_ca_that_expired_five_days_ago(tmp_path: Path) -> None:
    old = write_ca(
        tmp_path, not_before=NOW - dt.timedelta(days=370), not_after=NOW - dt.timedelta(days=5)
    )
    issued = init_certs(tmp_path, _config(tmp_path))
    assert not issued.ca_reused
    assert issued.ca_replaced is not None and "expired on" in issued.ca_replaced
    assert _leaf(tmp_path / "ca.crt").fingerprint(hashes.SHA256()) != old.fingerprint(
        hashes.SHA256()
    )
    for identity in ("coordinator", "alpha", "bravo"):
        _verifies(tmp_path, identity)
        assert (tmp_path / identity / "ca.crt").read_bytes() == (tmp_path / "ca.crt").read_bytes()


def test_certs_init_renews_a_ca_expiring_within_the_margin_and_reuses_a_healthy_one(
    tmp_path: Path,
) -> None:
    soon = tmp_path / "soon"
    write_ca(soon, not_before=NOW - dt.timedelta(days=300), not_after=NOW + dt.timedelta(days=10))
    issued = init_certs(soon, _config(soon, warning_days=30))
    assert not issued.ca_reused and "within 30 days" in str(issued.ca_replaced)
    _verifies(soon, "alpha")
    healthy = tmp_path / "healthy"
    ca = write_ca(
        healthy, not_before=NOW - dt.timedelta(days=1), not_after=NOW + dt.timedelta(days=200)
    )
    issued = init_certs(healthy, _config(healthy))
    assert issued.ca_reused and issued.ca_replaced is None
    _verifies(healthy, "alpha")
    # A leaf never outlives the CA that signed it.
    assert _leaf(healthy / "alpha" / "tls.crt").not_valid_after_utc <= ca.not_valid_after_utc


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_renewed_leaves_pass_openssl_verify(tmp_path: Path) -> None:
    write_ca(
        tmp_path, not_before=NOW - dt.timedelta(days=370), not_after=NOW - dt.timedelta(days=5)
    )
    init_certs(tmp_path, _config(tmp_path))
    for identity in ("coordinator", "alpha"):
        proc = subprocess.run(
            [
                "openssl",
                "verify",
                "-CAfile",
                str(tmp_path / "ca.crt"),
                str(tmp_path / identity / "tls.crt"),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_cli_says_it_renewed_the_ca(tmp_path: Path) -> None:
    write_ca(
        tmp_path, not_before=NOW - dt.timedelta(days=370), not_after=NOW - dt.timedelta(days=5)
    )
    result = run_cli("certs", "init", str(tmp_path), "--config", str(REPO / "config/local.yaml"))
    assert result.code == 0, result.err
    assert "renewed the development CA (it expired on" in result.err  # status: stderr
    assert "reused" not in result.err


def test_an_expired_own_certificate_is_refused_at_start_naming_field_and_date(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    init_certs(tmp_path, config)
    old = tmp_path / "old"
    write_ca(old, not_before=NOW - dt.timedelta(days=400), not_after=NOW - dt.timedelta(days=35))
    (tmp_path / "coordinator" / "tls.crt").write_bytes((old / "ca.crt").read_bytes())
    with pytest.raises(ConfigError) as caught:
        check_tls_files(config, "coordinator")
    text = str(caught.value)
    assert text.startswith("network.tls.cert_file: ")
    assert "expired on" in text and "(35 days ago)" in text and "certs init" in text
    assert check_tls_files(config, "alpha") == []  # another identity is fine


def test_an_expired_ca_bundle_is_refused_and_an_expiring_one_warned(tmp_path: Path) -> None:
    config = _config(tmp_path, warning_days=30)
    init_certs(tmp_path, config)
    expiring = tmp_path / "expiring"
    write_ca(
        expiring, not_before=NOW - dt.timedelta(days=300), not_after=NOW + dt.timedelta(days=12)
    )
    (tmp_path / "alpha" / "ca.crt").write_bytes((expiring / "ca.crt").read_bytes())
    (warning,) = check_tls_files(config, "alpha")
    assert warning.startswith("network.tls.ca_file: ") and "in 11 days" in warning
    expired = tmp_path / "expired"
    write_ca(
        expired, not_before=NOW - dt.timedelta(days=300), not_after=NOW - dt.timedelta(hours=1)
    )
    (tmp_path / "alpha" / "ca.crt").write_bytes((expired / "ca.crt").read_bytes())
    with pytest.raises(ConfigError, match=r"^network\.tls\.ca_file: .* expired on"):
        check_tls_files(config, "alpha")


def test_a_certificate_not_yet_valid_is_refused(tmp_path: Path) -> None:
    write_ca(
        tmp_path, not_before=NOW + dt.timedelta(days=2), not_after=NOW + dt.timedelta(days=400)
    )
    with pytest.raises(ConfigError, match="is not valid before .* check this machine's clock"):
        check_validity(tmp_path / "ca.crt", "ca_file", warn_within_days=30)


def test_tls_off_checks_nothing(tmp_path: Path) -> None:
    config = validate_mapping({"network": {"tls": {"enabled": False}}})
    assert check_tls_files(config, "coordinator") == []


def test_development_certificates_accept_a_clock_a_few_hours_behind(tmp_path: Path) -> None:
    # Issue 41, item 16: backdated 5 minutes only, they were "not valid before" on a machine
    # whose clock was a little behind the one that issued them.
    from lensemble.network.shared.certs import CLOCK_SKEW, check_validity

    init_certs(tmp_path, _config(tmp_path))
    now = dt.datetime.now(dt.UTC)
    behind = now - dt.timedelta(hours=12)
    for identity in ("coordinator", "alpha"):
        leaf = _leaf(tmp_path / identity / "tls.crt")
        assert leaf.not_valid_before_utc <= now - CLOCK_SKEW + dt.timedelta(minutes=1)
        leaf.verify_directly_issued_by(_leaf(tmp_path / "ca.crt"))
        for name, field in (("tls.crt", "cert_file"), ("ca.crt", "ca_file")):
            path = tmp_path / identity / name
            assert check_validity(path, field, warn_within_days=30, now=behind) == []
