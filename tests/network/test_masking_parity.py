"""Masked rounds over gRPC (mTLS on loopback) commit the in-process simulation's model hashes.

The masked sum is exact fixed point, so a network run of a config and its in-process simulation
must commit the same global models bit for bit, with the same contributors and exclusions, also
when a participant stops answering after it advertised and shared its keys (``delay``: it never
uploads its masked vector; the round commits with the survivors and the ledger names it). Only
what depends on the identity keys (signatures, digests of masked vectors) may differ.
Participants run the production :class:`ParticipantLoop` in threads
(``tests.support.faulty_network``).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from lensemble.config.load import validate_mapping
from lensemble.federation.faults import parse_faults
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.masking import SessionKey
from lensemble.federation.messages import RoundOpening
from lensemble.federation.payload import manifest
from lensemble.federation.secagg.groups import assign_groups
from lensemble.federation.signed_rounds import SignedRounds
from lensemble.network.participant.call_errors import classify
from lensemble.network.participant.client import CoordinatorClient
from lensemble.network.participant.masked_round import MaskedRounds, _Attempt
from lensemble.network.shared.proto import lensemble_pb2 as pb
from tests.support.faulty_network import run_over_grpc
from tests.support.federation import build, initial_params
from tests.support.network import (
    LiveCoordinator,
    ParticipantThread,
    network_mapping,
    write_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _outcome(records: list[RoundRecord]) -> list[tuple[Any, ...]]:
    groups = [
        [(g.get("survivors"), g.get("aborted")) for g in r.defences["masking"]["groups"]]
        for r in records
    ]
    return [
        (r.round, r.attempt, r.state, r.contributors, r.excluded, r.model_hash, g)
        for r, g in zip(records, groups, strict=True)
    ]


@pytest.mark.parametrize(
    ("faults", "federation"),
    [
        pytest.param("", {"rounds": 3}, id="clean"),
        pytest.param("delay:charlie@1", {"rounds": 2}, id="silent-after-sharing"),
        pytest.param(
            "drop:alpha@0,delay:bravo@1",
            {"rounds": 2, "masking": {"group_size": 3}, "quorum": 3},
            id="dropped-then-silent",
        ),
    ],
)
def test_a_masked_network_run_commits_the_in_process_hashes(
    tmp_path: Path, faults: str, federation: dict[str, Any]
) -> None:
    mapping = network_mapping(tmp_path, aggregation="masking", round_timeout_s=20, **federation)
    mapping["network"].update(rpc_timeout_s=1, keepalive_s=1, liveness_timeout_s=2.5)
    _, config = write_config(tmp_path, mapping)
    in_process_config = validate_mapping(
        dict(mapping, federation={**mapping["federation"], "transport": "in_process"})
    )
    coordinator, transport, _ = build(
        in_process_config, faults=parse_faults(faults), output_dir=tmp_path / "in-process"
    )
    coordinator.run(transport)
    expected = _outcome(coordinator.records)
    run = run_over_grpc(config, parse_faults(faults), tmp_path / "network")
    assert run.error is None, run.error
    assert run.participant_errors() == [], run.participant_errors()
    assert [t.loop.masked.refusals for t in run.threads] == [[]] * 4  # type: ignore[union-attr]
    assert _outcome(run.records) == expected
    # What each signed is on disk beside its inner state, as a restarted process reads it.
    for t in run.threads:
        signed = t.loop.masked.signed  # type: ignore[union-attr]
        assert signed.path == t.loop.participant.masking_record and signed.path is not None
        assert signed.latest is not None and SignedRounds(signed.path).latest == signed.latest
    if not faults:  # every participant answered every stage of every round
        rounds = [(r, 0) for r in range(config.federation.rounds)]
        assert [t.loop.rounds_contributed for t in run.threads] == [rounds] * 4
    if "delay" in faults:  # the silent one is named, the round committed without it
        assert any(
            state == "closed" and "masking_dropped" in excluded.values()
            for _, _, state, _, excluded, _, _ in expected
        )


def test_hostile_answers_over_grpc_are_refused_by_name_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    mapping = network_mapping(tmp_path, aggregation="masking", rounds=2, round_timeout_s=20)
    mapping["network"].update(rpc_timeout_s=1, keepalive_s=1, liveness_timeout_s=2.5)
    _, config = write_config(tmp_path, mapping)
    in_process = validate_mapping(
        dict(mapping, federation={**mapping["federation"], "transport": "in_process"})
    )
    coordinator, transport, _ = build(in_process)
    expected = _outcome(coordinator.run(transport).records)
    with LiveCoordinator(config) as live:
        hostile = CoordinatorClient(config, "alpha")  # alpha's own certificate, misbehaving
        assert hostile.join().accepted
        masked = MaskedRounds(config, hostile, manifest(initial_params(3)), threading.Event())
        # Each attempt's client shares the process's record of the survivor sets it signed.
        opening = RoundOpening(0, 0, 0, "sha256:" + "0" * 64, 0.0)
        attempt_client = masked._client_for(_Attempt(opening, np.zeros(1), {}), pb.MaskingStage())
        assert attempt_client is not None and attempt_client.signed is masked.signed
        for key, stage, reason in [
            (SessionKey(0, 0, 0), "gossip", "unknown_stage"),
            (SessionKey(99, 0, 0), "share", "unknown_session"),
            (SessionKey(0, 0, 0), "s" * 40, "oversized_field"),
        ]:
            with pytest.raises(grpc.RpcError) as refused:
                masked.answer(key, stage, b"x" * 64, {})
            assert classify(refused.value).reason == reason
        hostile.close()
        threads = [ParticipantThread(config, pid) for pid in config.participant_ids]
        live.thread.join(120)
        assert live.error is None, live.error
        for t in threads:
            t.thread.join(30)
            t.close()
        assert _outcome(live.coordinator.records) == expected


NINE = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india")


def test_groups_drawn_from_the_present_set_commit_the_in_process_hashes(tmp_path: Path) -> None:
    """Nine in groups of 3: one absent from round 0, two silent mid-session in round 1.

    Round 0 draws its groups from the eight present (over the network: those that trained by
    the attempt's deadline); round 1's first attempt loses two groups of 3 and its retry
    regroups the seven still there. The network commits the in-process ledger's outcome.
    """
    groups = assign_groups(NINE, 3, 3, 1).groups
    silent = (groups[0][0], groups[1][0])
    absent = next(p for p in NINE if p not in silent)
    faults = f"drop:{absent}@0,delay:{silent[0]}@1,delay:{silent[1]}@1"
    participants = [{"id": pid} for pid in NINE]
    federation = {"rounds": 2, "masking": {"group_size": 3}, "quorum": 5}
    mapping = network_mapping(
        tmp_path,
        aggregation="masking",
        round_timeout_s=8,
        participants=participants,
        **federation,
    )
    mapping["network"].update(rpc_timeout_s=1, keepalive_s=1, liveness_timeout_s=2.5)
    _, config = write_config(tmp_path, mapping)
    in_process_config = validate_mapping(
        dict(mapping, federation={**mapping["federation"], "transport": "in_process"})
    )
    coordinator, transport, _ = build(
        in_process_config, faults=parse_faults(faults), output_dir=tmp_path / "in-process"
    )
    coordinator.run(transport)
    expected = _outcome(coordinator.records)
    assert [(r[0], r[1], r[2]) for r in expected] == [
        (0, 0, "closed"),
        (1, 0, "aborted"),
        (1, 1, "closed"),
    ]
    run = run_over_grpc(config, parse_faults(faults), tmp_path / "network", timeout_s=240)
    assert run.error is None, run.error
    assert run.participant_errors() == [], run.participant_errors()
    assert all(t.loop.masked.refusals == [] for t in run.threads)  # type: ignore[union-attr]
    records = run.records
    assert _outcome(records) == expected
    presents = [r.defences["masking"].get("present") for r in records]
    assert presents == [
        [p for p in NINE if p != absent],
        None,
        [p for p in NINE if p not in silent],
    ]
