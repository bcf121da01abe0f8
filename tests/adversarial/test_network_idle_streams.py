"""Issue 12.3: idle streams must not lock honest participants out (real processes).

The coordinator runs as a process (``tests.support.netproc``); an attacker in this test opens 20
``SubmitUpdate`` streams that never send a byte (no client deadline), then the four honest
participants start. On main, 20 idle streams filled the server's 3n+8 = 20 call slots and every
honest ``Join`` failed with ``RESOURCE_EXHAUSTED``. Now the coordinator authenticates each call
from its metadata / certificate before reading it, holds each participant to its own allowance,
and cancels a call at its server-side deadline.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from lensemble.network.participant.client import coordinator_target
from lensemble.network.shared.identity import PARTICIPANT_KEY
from lensemble.network.shared.proto import lensemble_pb2 as pb
from lensemble.network.shared.proto import lensemble_pb2_grpc as pb_grpc
from lensemble.network.shared.transport_errors import REASON_KEY
from tests.support.network import federation, ledger, network_mapping, write_config

pytestmark = pytest.mark.slow
START_S = 90.0  # process start-up on a loaded 2-core machine (torch import)
IDLE_STREAMS = 20
PARTICIPANTS = ("alpha", "bravo", "charlie", "delta")


def _idle(stop: threading.Event) -> Iterator[pb.UpdateChunk]:
    """A request stream that sends nothing until the test ends."""
    stop.wait(START_S * 2)
    yield from ()


def _attack(
    config: Any, certs: Path, identity: str | None, claim: str | None, stop: threading.Event
) -> tuple[grpc.Channel, list[grpc.Future]]:
    """Open IDLE_STREAMS idle SubmitUpdate calls, with ``identity``'s certificate (or none)."""
    ca = (certs / "ca.crt").read_bytes()
    if identity is None:
        credentials = grpc.ssl_channel_credentials(root_certificates=ca)
    else:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=(certs / identity / "tls.key").read_bytes(),
            certificate_chain=(certs / identity / "tls.crt").read_bytes(),
        )
    channel = grpc.secure_channel(coordinator_target(config), credentials)
    stub = pb_grpc.CoordinatorStub(channel)
    metadata = () if claim is None else ((PARTICIPANT_KEY, claim),)
    calls = [stub.SubmitUpdate.future(_idle(stop), metadata=metadata) for _ in range(IDLE_STREAMS)]
    return channel, calls


def _outcome(call: grpc.Future, timeout_s: float) -> tuple[grpc.StatusCode, str | None]:
    error = call.exception(timeout=timeout_s)
    assert isinstance(error, grpc.RpcError), "an idle stream was answered OK"
    return error.code(), dict(error.trailing_metadata() or ()).get(REASON_KEY)


def _start_honest(fed: Any) -> list[Any]:
    return [fed.start_participant(pid) for pid in PARTICIPANTS]


def _honest_run_completes(fed: Any, config: Any, participants: list[Any]) -> None:
    """Each participant joins (ready line) without a capacity refusal; every round commits."""
    for proc in participants:
        assert proc.wait_ready(START_S)["participant_id"] == proc.identity
    assert fed["coordinator"].wait(START_S) == 0
    assert [p.wait(30) for p in participants] == [0, 0, 0, 0]
    for proc in participants:
        refused = [e for e in proc.events if e.get("reason") == "resource_exhausted"]
        assert refused == [], f"{proc.identity} was refused for lack of capacity: {refused}"
    records = ledger(config)
    assert [r.state for r in records] == ["closed"] * config.federation.rounds


def test_twenty_idle_streams_without_a_token_are_refused_before_any_read(tmp_path: Path) -> None:
    mapping = network_mapping(tmp_path, rounds=2)
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    secrets = {pid: f"{pid}-token-{'x' * 20}" for pid in PARTICIPANTS}
    for pid, token in secrets.items():
        (tokens / pid).write_text(token, encoding="utf-8")
    (tokens / "coordinator").write_text(
        "\n".join(f"{pid} {token}" for pid, token in secrets.items()), encoding="utf-8"
    )
    mapping["network"]["auth"] = "token"
    mapping["network"]["tls"]["client_auth"] = False
    mapping["network"]["token_file"] = str(tokens / "{identity}")
    path, config = write_config(tmp_path, mapping)
    stop = threading.Event()
    with federation(tmp_path, path) as fed:
        fed.start_coordinator().wait_ready(START_S)
        # No token at all, claiming a real participant or nobody.
        channel, calls = _attack(config, tmp_path / "certs", None, "alpha", stop)
        other, more = _attack(config, tmp_path / "certs", None, None, stop)
        try:
            for call in calls + more:
                # Refused at once: the coordinator never waits for the first message.
                code, _ = _outcome(call, timeout_s=30)
                assert code == grpc.StatusCode.PERMISSION_DENIED
            _honest_run_completes(fed, config, _start_honest(fed))
        finally:
            stop.set()
            channel.close()
            other.close()


def test_twenty_idle_streams_with_one_participants_certificate_starve_nobody(
    tmp_path: Path,
) -> None:
    mapping = network_mapping(tmp_path, rounds=2)
    # The held stream lasts one RPC deadline: long enough to overlap the honest joins.
    mapping["network"]["rpc_timeout_s"] = 15
    path, config = write_config(tmp_path, mapping)
    stop = threading.Event()
    with federation(tmp_path, path) as fed:
        fed.start_coordinator().wait_ready(START_S)
        certs = tmp_path / "certs"
        # A compromised alpha: its own certificate, claiming itself, then claiming bravo.
        channel, calls = _attack(config, certs, "alpha", "alpha", stop)
        forged, as_bravo = _attack(config, certs, "alpha", "bravo", stop)
        participants = _start_honest(fed)
        try:
            for call in as_bravo:
                code, reason = _outcome(call, timeout_s=30)
                assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "bad_credentials")
            # One upload at a time per participant: all but one refused at once.
            refused = []
            for call in calls:
                with contextlib.suppress(grpc.FutureTimeoutError):  # the one alpha may hold
                    refused.append(_outcome(call, timeout_s=5))
            assert refused == [(grpc.StatusCode.RESOURCE_EXHAUSTED, "too_many_calls")] * (
                IDLE_STREAMS - 1
            )
            # Honest participants (alpha's real process too) join and finish while the
            # attacker's held stream waits for its server-side deadline.
            _honest_run_completes(fed, config, participants)
            # The held stream ends by the coordinator's deadline, not by the attacker.
            outcomes = [
                _outcome(call, timeout_s=config.network.rpc_timeout_s * 3) for call in calls
            ]
            assert sorted(outcomes, key=str) == sorted(
                [*refused, (grpc.StatusCode.CANCELLED, None)], key=str
            )
        finally:
            stop.set()
            channel.close()
            forged.close()
