"""The chart runs secure aggregation: each participant pod trusts the CA of every peer.

Over the network a participant accepts a peer's masking keys only from a certificate issued
directly by a CA of its own ``network.tls.ca_file`` (:mod:`lensemble.network.participant.peer_keys`).
These tests lay a rendered participant pod's TLS volume out on disk, filled the way the cluster
fills it (cert-manager or the organisations' CAs write each identity's Secret, the federation
writes its CA bundle Secret), read the pod's mounted config with its paths moved there, and run
the runtime's own peer-key check on every peer's certificate as the coordinator relays it. The
manifests of these cases pass kubernetes-validate with every other case
(``test_kubernetes_schemas.py``); no cluster runs them here.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from lensemble.errors import UsageError
from lensemble.network.participant.peer_keys import (
    PeerCertificateRefused,
    trusted_authorities,
    trusted_peer_keys,
)
from tests.config.rule_examples import edited_values
from tests.k8s import pki
from tests.k8s.pods import Docs, Secrets, lay_out, pod_config, pods_of, volume
from tests.k8s.renders import (
    CLUSTER_ISSUER,
    ENVS,
    FEDERATION_BUNDLE_SECRET,
    PROD_DOMAINS,
    config_of,
    render,
    values_of,
)
from tests.support.tools import require

BUNDLE_CASE = "helm-sovereign-prod-masking-org-berlin"
#: The sovereign federation of the bundle case: a consortium root that signs the coordinator,
#: and one intermediate CA per organisation that signs its participants.
CONSORTIUM = pki.authority("lensemble-consortium")
ORGANISATION_CAS = {td: pki.authority(f"{td}-ca", CONSORTIUM) for td in PROD_DOMAINS}
FEDERATION_BUNDLE = b"".join(ca.pem for ca in (CONSORTIUM, *ORGANISATION_CAS.values()))


def _pod_trusts(
    docs: Docs, secrets: Secrets, relayed: dict[str, bytes], tmp_path: Path
) -> dict[str, set[str]]:
    """Per participant pod identity, the peers whose relayed certificate it accepts."""
    trusted: dict[str, set[str]] = {}
    pods = pods_of(docs, "participant")
    assert pods
    for i, (namespace, pod) in enumerate(pods):
        root = tmp_path / str(i)
        lay_out(namespace, pod, secrets, root)
        config = pod_config(docs, namespace, pod, root)
        assert config.federation.aggregation == "masking"
        for pid in pod["metadata"]["annotations"]["lensemble.dev/participants"].split(","):
            peers = {p: pem for p, pem in relayed.items() if p != pid}
            authorities = trusted_authorities(config, pid)
            trusted[pid] = set(trusted_peer_keys(peers, authorities))
    return trusted


@pytest.mark.parametrize("env", ENVS)
def test_every_participant_pod_accepts_every_peer_under_one_cert_manager_issuer(
    env: str, tmp_path: Path
) -> None:
    docs = render(f"helm-{env}-masking")
    certificates = [d for d in docs if d["kind"] == "Certificate"]
    assert {c["spec"]["issuerRef"]["name"] for c in certificates} == {CLUSTER_ISSUER}
    # cert-manager: the issuer signs each Certificate into its Secret, ca.crt = the issuer.
    issuer = pki.authority(CLUSTER_ISSUER)
    secrets = {
        (c["metadata"]["namespace"], c["spec"]["secretName"]): pki.issue(
            issuer, c["spec"]["commonName"]
        )
        for c in certificates
    }
    ids = config_of(f"helm-{env}-masking").participant_ids
    relayed = {
        pid: next(s["tls.crt"] for (_, name), s in secrets.items() if name.endswith(f"-{pid}-tls"))
        for pid in ids
    }
    trusted = _pod_trusts(docs, secrets, relayed, tmp_path)
    assert trusted == {pid: set(ids) - {pid} for pid in ids}


def _bundle_case_secrets(docs: Docs) -> tuple[Secrets, dict[str, bytes]]:
    """Each participant's Secret from its organisation's CA, ca.crt the consortium root only.

    Beside them, in every namespace, the federation's CA bundle Secret.
    """
    config = config_of(BUNDLE_CASE)
    issued = {
        p.id: pki.issue(ORGANISATION_CAS[p.trust_domain], p.id)
        for p in config.federation.participants
    }
    secrets: Secrets = {}
    for namespace, pod in pods_of(docs, "participant"):
        secrets[(namespace, FEDERATION_BUNDLE_SECRET)] = {"ca.crt": FEDERATION_BUNDLE}
        for source in volume(pod, "tls")["projected"]["sources"]:
            name = source["secret"]["name"]
            if name != FEDERATION_BUNDLE_SECRET:
                pid = source["secret"]["items"][0]["path"].split("/")[0]
                secrets[(namespace, name)] = {**issued[pid], "ca.crt": CONSORTIUM.pem}
    return secrets, {pid: data["tls.crt"] for pid, data in issued.items()}


def test_the_federation_ca_bundle_lets_a_participant_accept_every_organisations_peers(
    tmp_path: Path,
) -> None:
    docs = render(BUNDLE_CASE)
    (_, pod), *others = pods_of(docs, "participant")
    assert others == []
    sources = volume(pod, "tls")["projected"]["sources"]
    ca_from = {i["path"]: s["secret"]["name"] for s in sources for i in s["secret"]["items"]}
    assert ca_from["berlin/ca.crt"] == FEDERATION_BUNDLE_SECRET
    secrets, relayed = _bundle_case_secrets(docs)
    trusted = _pod_trusts(docs, secrets, relayed, tmp_path)
    assert trusted == {"berlin": {"dublin", "paris", "stockholm"}}


def test_without_the_bundle_a_root_above_the_organisations_cas_is_refused(
    tmp_path: Path,
) -> None:
    """The Secret's ca.crt alone (the root) does not issue the peers' certificates directly."""
    from lensemble.render.k8s import render_chart

    require("helm")
    values = copy.deepcopy(values_of(BUNDLE_CASE))
    values["tls"] = {}
    docs = render_chart(values)
    secrets, relayed = _bundle_case_secrets(docs)
    with pytest.raises(PeerCertificateRefused, match="does not chain"):
        _pod_trusts(docs, secrets, relayed, tmp_path)


def test_a_bundle_secret_without_tls_is_refused_naming_the_field() -> None:
    from lensemble.render.k8s import render_chart

    require("helm")
    values = edited_values(
        "helm-local", (("network.auth", "insecure"), ("network.tls.enabled", False))
    )
    values["tls"] = {"caBundleSecret": FEDERATION_BUNDLE_SECRET}
    with pytest.raises(UsageError, match=r"tls\.caBundleSecret: it is set but config\.network"):
        render_chart(values)
