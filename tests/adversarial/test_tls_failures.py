"""A certificate problem is a permanent, named failure, not "has the coordinator started?".

On main a participant facing a coordinator whose certificate had expired logged "certificate has
expired" seven times, retried it as transient until ``join_timeout_s``, and ended with "has not
answered ... check that the coordinator runs". Real gRPC servers on loopback, real handshakes.
"""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from lensemble.config import LensembleConfig
from lensemble.federation.coordinator import global_architecture
from lensemble.network.coordinator.authenticator import Authenticator
from lensemble.network.coordinator.server import start_coordinator_server
from lensemble.network.coordinator.transport import GrpcCoordinatorTransport
from lensemble.network.participant.client import CoordinatorClient
from lensemble.network.participant.loop import ParticipantLoop
from lensemble.network.shared.certs import init_certs
from lensemble.network.shared.security import server_credentials
from lensemble.network.shared.transport_errors import CertificateRejected, certificate_failure
from tests.support.federation import initial_params
from tests.support.network import network_mapping, write_config

pytestmark = pytest.mark.integration

NOW = dt.datetime.now(dt.UTC)
LENSEMBLE = shutil.which("lensemble") or "lensemble"


def _reissue(
    certs: Path,
    identity: str,
    *,
    names: list[str],
    server: bool,
    not_after: dt.datetime,
    signer: Path | None = None,
) -> None:
    """Replace ``identity``'s certificate with one valid until ``not_after`` (maybe expired)."""
    signer = signer or certs
    ca_key = serialization.load_pem_private_key((signer / "ca.key").read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate((signer / "ca.crt").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_after - dt.timedelta(days=365))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    (certs / identity / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (certs / identity / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[tuple[LensembleConfig, Path]]:
    mapping = network_mapping(tmp_path)
    mapping["network"]["host"] = "localhost"
    mapping["federation"]["join_timeout_s"] = 120
    _, config = write_config(tmp_path, mapping)
    yield config, tmp_path / "certs"


def _serve(config: LensembleConfig) -> Any:
    transport = GrpcCoordinatorTransport(config, next_round=0)
    server, _ = start_coordinator_server(
        transport,
        Authenticator(config, config.participant_ids),
        server_credentials(config),
        host="127.0.0.1",
        port=config.network.port,
        architecture=global_architecture(initial_params(config.run.root_seed)),
    )
    return server


def _join(config: LensembleConfig) -> tuple[CertificateRejected, ParticipantLoop]:
    client = CoordinatorClient(config, config.participant_ids[0])
    loop = ParticipantLoop(config, None, client)  # type: ignore[arg-type] (never trains)
    try:
        with pytest.raises(CertificateRejected) as caught:
            loop.join()
    finally:
        client.close()
    return caught.value, loop


def test_an_expired_coordinator_certificate_stops_the_participant_at_once(federation) -> None:
    config, certs = federation
    _reissue(
        certs,
        "coordinator",
        names=["localhost"],
        server=True,
        not_after=NOW - dt.timedelta(days=35),
    )
    server = _serve(config)
    try:
        error, loop = _join(config)
    finally:
        server.stop(None)
    assert loop.backoff.attempt == 0, "a certificate failure was retried as transient"
    assert "expired" in error.message and "TLS handshake" in error.message
    assert "has not answered" not in str(error)
    assert error.exit_code == 3


@pytest.mark.parametrize("role", ["coordinator", "participant"])
def test_a_process_with_an_expired_certificate_refuses_to_start(federation, role: str) -> None:
    # A client certificate the coordinator refuses shows only as "Socket closed" on the
    # participant: its own certificate is therefore checked before it dials.
    config, certs = federation
    identity = "coordinator" if role == "coordinator" else config.participant_ids[0]
    _reissue(
        certs,
        identity,
        names=["localhost" if role == "coordinator" else identity],
        server=role == "coordinator",
        not_after=NOW - dt.timedelta(days=35),
    )
    args = ["--port", "0"] if role == "coordinator" else ["--id", identity]
    proc = subprocess.run(
        [
            LENSEMBLE,
            role,
            "--config",
            str(certs.parent / "config.yaml"),
            "--health-port",
            "0",
            "--metrics-port",
            "0",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "network.tls.cert_file: the certificate of" in proc.stderr
    assert "(35 days ago)" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""  # never announced ready


def test_a_coordinator_signed_by_another_ca_is_named_as_such(federation, tmp_path: Path) -> None:
    config, certs = federation
    other = tmp_path / "other"
    init_certs(other, config)
    _reissue(
        certs,
        "coordinator",
        names=["localhost"],
        server=True,
        not_after=NOW + dt.timedelta(days=30),
        signer=other,
    )
    server = _serve(config)
    try:
        error, _ = _join(config)
    finally:
        server.stop(None)
    assert "network.tls.ca_file" in error.message or "failed verification" in error.message


@pytest.mark.parametrize(
    "details",
    [
        "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:1: "
        "Connection refused",
        "Deadline Exceeded",
        "Socket closed",
    ],
)
def test_transient_failures_are_not_certificate_failures(details: str) -> None:
    assert certificate_failure(details) is None
