"""The one container view of a config, as Compose and Kubernetes both use it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lensemble.config import LensembleConfig, config_hash, load_config
from lensemble.errors import IntegrityError
from lensemble.render.compose import compose_container_config
from lensemble.render.container import STATE_DIR, TLS_DIR, container_config
from lensemble.render.helm_values import pod_config
from tests.k8s.renders import ENVS, REPO

SUBSTRATES: dict[str, Callable[[LensembleConfig], LensembleConfig]] = {
    "compose": compose_container_config,
    "kubernetes": pod_config,
}


def _config(env: str) -> LensembleConfig:
    return load_config(REPO / "config" / f"{env}.yaml", ["federation.transport=network"])


@pytest.mark.parametrize("substrate", sorted(SUBSTRATES))
@pytest.mark.parametrize("env", ENVS)
def test_every_substrate_keeps_the_hash_and_the_contract_paths(substrate: str, env: str) -> None:
    source = _config(env)
    inside = SUBSTRATES[substrate](source)
    assert config_hash(inside) == config_hash(source)
    assert inside.run.output_dir == STATE_DIR
    assert inside.network.tls.cert_file.startswith(f"{TLS_DIR}/")
    assert inside.observability.log_format == "json"


def test_a_rewrite_that_changes_the_hash_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both substrates go through this check, so neither can ship a config with another hash."""
    from lensemble.config import hashing

    source = _config("local")
    real = hashing.config_hash
    monkeypatch.setattr(
        hashing, "config_hash", lambda c: real(c) + ("x" if c.run.output_dir == STATE_DIR else "")
    )
    with pytest.raises(IntegrityError, match="changed the config hash"):
        container_config(source, coordinator_host="coordinator", tls_dir=TLS_DIR)
    for rewrite in SUBSTRATES.values():
        with pytest.raises(IntegrityError):
            rewrite(source)
