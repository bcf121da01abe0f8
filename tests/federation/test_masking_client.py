"""A participant's side of masked rounds answers only the sessions it belongs to, once."""

from __future__ import annotations

import numpy as np

from lensemble.config import LensembleConfig
from lensemble.federation.masking import SessionKey, session_contexts
from lensemble.federation.masking_client import MaskingClient
from lensemble.federation.payload import manifest
from lensemble.federation.secagg.identity import simulation_identity
from lensemble.federation.secagg.keys import simulation_seed
from lensemble.federation.secagg.messages import KeyAdvert
from tests.support.federation import initial_params, small_config

PARTICIPANT_LIST = [{"id": f"site-{i}"} for i in range(7)]


def _client(pid: str, **federation: object) -> tuple[MaskingClient, LensembleConfig]:
    config = small_config(aggregation="masking", **federation)
    ids = config.participant_ids
    keys = {p: simulation_identity(3, p) for p in ids}
    arch = manifest(initial_params())
    client = MaskingClient(
        config,
        pid,
        seed=simulation_seed(3, pid),
        identity_key=keys[pid],
        verifiers={p: k.public_key() for p, k in keys.items()},
        architecture=arch,
    )
    return client, config


def test_it_advertises_once_for_an_attempt_it_trained_and_for_its_own_group_only() -> None:
    client, _ = _client("alpha")
    d = sum(t.numel() for t in initial_params().values())
    assert client.answer(SessionKey(0, 0, 0), "advertise", b"") is None  # nothing held yet
    client.hold(0, 0, np.zeros(d, dtype=np.float32))
    assert client.answer(SessionKey(0, 1, 0), "advertise", b"") is None  # another attempt
    assert client.answer(SessionKey(0, 0, 1), "advertise", b"") is None  # no such group
    advert = client.answer(SessionKey(0, 0, 0), "advertise", b"")
    assert advert is not None and KeyAdvert.decode(advert).sender == "alpha"
    assert client.answer(SessionKey(0, 0, 0), "advertise", b"") is None  # a second start
    client.forget()
    assert client.answer(SessionKey(0, 0, 0), "share", b"") is None


def test_with_several_groups_it_answers_its_own_group_and_refuses_a_malformed_message() -> None:
    client, config = _client("site-0", participants=PARTICIPANT_LIST, quorum=4)
    arch = manifest(initial_params())
    contexts = session_contexts(config, 2, 0, arch)
    assert len(contexts) == 2
    mine = next(c.group for c in contexts if "site-0" in c.roster)
    d = contexts[0].dimension
    client.hold(2, 0, np.zeros(d, dtype=np.float32))
    assert client.answer(SessionKey(2, 0, 1 - mine), "advertise", b"") is None
    assert client.answer(SessionKey(2, 0, mine), "advertise", b"") is not None
    assert client.answer(SessionKey(2, 0, mine), "share", b"not a roster") is None
    assert [r.reason.value for r in client.refusals] == ["bad_message"]
