"""The chart runs differential privacy: each pod mounts its settings and seeds noise from its key.

A participant's own DP-SGD noise and the coordinator's central noise come from secrets that
only the key's holder can compute: seeds derived from the pod's own TLS private key
(:mod:`lensemble.network.shared.key_seeds`). These tests lay a rendered pod's TLS volume out on
disk, filled as cert-manager fills it, read the pod's mounted config, and derive the seeds with
the runtime's own code. The manifests pass kubernetes-validate with every other case
(``test_kubernetes_schemas.py``); no cluster runs them here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lensemble.config import LensembleConfig
from lensemble.network.coordinator.noise_seed import coordinator_noise_seed
from lensemble.network.participant.peer_keys import own_identity, secret_seed
from lensemble.network.participant.privacy_seed import noise_seed
from tests.k8s import pki
from tests.k8s.pods import Docs, lay_out, pod_config, pods_of
from tests.k8s.renders import CLUSTER_ISSUER, config_of, render

PLAIN, MASKED = "helm-sovereign-prod-privacy", "helm-sovereign-prod-privacy-masking"


def _pod_configs(docs: Docs, component: str, root: Path) -> list[LensembleConfig]:
    """The config of every pod of ``component``, its TLS volume laid out with fresh keys."""
    issuer = pki.authority(CLUSTER_ISSUER)
    secrets = {
        (c["metadata"]["namespace"], c["spec"]["secretName"]): pki.issue(
            issuer, c["spec"]["commonName"]
        )
        for c in docs
        if c["kind"] == "Certificate"
    }
    configs = []
    for i, (namespace, pod) in enumerate(pods_of(docs, component)):
        lay_out(namespace, pod, secrets, root / str(i))
        configs.append(pod_config(docs, namespace, pod, root / str(i)))
    assert configs
    return configs


@pytest.mark.parametrize("case", [PLAIN, MASKED])
def test_every_pod_mounts_the_privacy_settings_of_the_config(case: str, tmp_path: Path) -> None:
    source = config_of(case)
    docs = render(case)
    for component in ("coordinator", "participant"):
        for config in _pod_configs(docs, component, tmp_path / component):
            assert config.federation.central_privacy == source.federation.central_privacy
            assert [p.privacy for p in config.federation.participants] == [
                p.privacy for p in source.federation.participants
            ]


def test_the_coordinator_pod_seeds_central_noise_from_its_own_key(tmp_path: Path) -> None:
    docs = render(PLAIN)
    (first,) = _pod_configs(docs, "coordinator", tmp_path / "a")
    seed = coordinator_noise_seed(first)
    assert seed is not None and seed == coordinator_noise_seed(first)
    # A key the cluster issued anew (another pod of the same release) gives another seed.
    (second,) = _pod_configs(render(PLAIN), "coordinator", tmp_path / "b")
    assert coordinator_noise_seed(second) not in (None, seed)


def test_under_masking_the_participant_pods_add_the_noise_from_their_own_keys(
    tmp_path: Path,
) -> None:
    docs = render(MASKED)
    (coordinator,) = _pod_configs(docs, "coordinator", tmp_path / "c")
    assert coordinator_noise_seed(coordinator) is None  # the sum carries the participants' noise
    private = config_of(MASKED).participant_ids[0]
    seeds: dict[str, bytes] = {}
    for i, config in enumerate(_pod_configs(docs, "participant", tmp_path / "p")):
        for pid in config.participant_ids:
            if (tmp_path / "p" / str(i) / pid).is_dir():
                seeds[pid] = secret_seed(own_identity(config, pid), config)
                if pid == private:  # its own DP-SGD noise, from its key too
                    assert noise_seed(config, pid) == noise_seed(config, pid)
    assert set(seeds) == set(config_of(MASKED).participant_ids)
    assert len(set(seeds.values())) == len(seeds)
