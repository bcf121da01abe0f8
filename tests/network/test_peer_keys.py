"""A participant's keys for masked rounds: peers' certificates are checked, never believed.

The coordinator relays every peer's certificate with the ``advertise`` stage; a participant
accepts a peer's key only from a certificate its own CA issued that names that peer, so a
coordinator cannot substitute a key (:mod:`lensemble.network.participant.peer_keys`).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from lensemble.config import LensembleConfig
from lensemble.config.load import validate_mapping
from lensemble.federation.secagg import identity
from lensemble.network.participant import masked_round
from lensemble.network.participant.peer_keys import (
    PeerCertificateRefused,
    own_identity,
    peer_key,
    secret_seed,
    trusted_authorities,
    trusted_peer_keys,
)
from lensemble.network.shared.certs import init_certs
from tests.support.network import network_mapping


def _config(tmp: Path, **run: object) -> LensembleConfig:
    mapping = network_mapping(tmp, aggregation="masking")
    mapping["run"].update(run)
    config = validate_mapping(mapping)
    init_certs(tmp / "certs", config)
    return config


def _pem(tmp: Path, pid: str) -> bytes:
    return (tmp / "certs" / pid / "tls.crt").read_bytes()


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LensembleConfig]:
    tmp = tmp_path_factory.mktemp("peer-keys")
    return tmp, _config(tmp)


def test_a_peer_key_from_our_ca_naming_the_peer_is_its_mtls_key(
    federation: tuple[Path, LensembleConfig],
) -> None:
    tmp, config = federation
    authorities = trusted_authorities(config, "alpha")
    keys = trusted_peer_keys({p: _pem(tmp, p) for p in config.participant_ids}, authorities)
    bravo = own_identity(config, "bravo")
    signature = identity.sign(bravo, b"roster")
    assert identity.verify(keys["bravo"], signature, b"roster")
    assert not identity.verify(keys["charlie"], signature, b"roster")


def test_a_certificate_naming_another_participant_is_refused(
    federation: tuple[Path, LensembleConfig],
) -> None:
    tmp, config = federation
    with pytest.raises(PeerCertificateRefused, match="names bravo, not charlie") as refused:
        peer_key("charlie", _pem(tmp, "bravo"), trusted_authorities(config, "alpha"))
    assert refused.value.participant == "charlie"


def test_a_certificate_from_another_ca_is_refused(
    federation: tuple[Path, LensembleConfig], tmp_path: Path
) -> None:
    _, config = federation
    _config(tmp_path)  # another run's CA issues another "charlie"
    with pytest.raises(PeerCertificateRefused, match="does not chain"):
        peer_key("charlie", _pem(tmp_path, "charlie"), trusted_authorities(config, "alpha"))


def test_garbage_and_expired_certificates_are_refused(
    federation: tuple[Path, LensembleConfig],
) -> None:
    tmp, config = federation
    authorities = trusted_authorities(config, "alpha")
    with pytest.raises(PeerCertificateRefused, match="not a PEM certificate"):
        peer_key("bravo", b"-----BEGIN CERTIFICATE-----\nnope\n", authorities)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=100 * 365)
    with pytest.raises(PeerCertificateRefused, match="not valid now"):
        peer_key("bravo", _pem(tmp, "bravo"), authorities, now=later)


def test_one_bad_certificate_refuses_the_whole_roster(
    federation: tuple[Path, LensembleConfig],
) -> None:
    tmp, config = federation
    relayed = {p: _pem(tmp, p) for p in config.participant_ids}
    relayed["delta"] = _pem(tmp, "alpha")  # the coordinator substitutes alpha's key for delta's
    with pytest.raises(PeerCertificateRefused, match="delta"):
        trusted_peer_keys(relayed, trusted_authorities(config, "bravo"))


def test_the_seed_is_secret_per_participant_and_the_same_on_a_rerun(
    federation: tuple[Path, LensembleConfig], tmp_path: Path
) -> None:
    _, config = federation
    alpha = secret_seed(own_identity(config, "alpha"), config)
    assert len(alpha) == 32
    assert alpha == secret_seed(own_identity(config, "alpha"), config)
    assert alpha != secret_seed(own_identity(config, "bravo"), config)
    other_run = _config(tmp_path, name="another")
    assert alpha != secret_seed(own_identity(config, "alpha"), other_run)


def test_the_reported_statistics_are_the_ledgers() -> None:
    from lensemble.federation.admission import SELF_REPORTED_RANGES

    assert set(masked_round.REPORTED) == set(SELF_REPORTED_RANGES)
