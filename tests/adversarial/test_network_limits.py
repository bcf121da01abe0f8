"""The network defences' pieces, in one process (unit tier).

Payload caps derived from the model (issue 12.5), the refusal of an impossible cap (15.4), the
zero-copy hashing assembler, per-participant call allowances and server-side deadlines (12.3),
and the transport's liveness bookkeeping (12.4).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from lensemble.config.load import validate_mapping
from lensemble.errors import ConfigError, PayloadError
from lensemble.federation.ledger import RoundRecord
from lensemble.federation.messages import Reason, RoundOpening, Submission, Verdict
from lensemble.federation.payload import TensorSpec, bytes_hash, encode
from lensemble.network.coordinator.authenticator import Authenticator
from lensemble.network.coordinator.call_guard import Allowances, Deadlines, pool_size
from lensemble.network.coordinator.transport import GrpcCoordinatorTransport
from lensemble.network.shared.payload_limits import HEADER_ROOM, payload_limits, wire_bytes
from lensemble.network.shared.streams import Assembler, TooLarge
from tests.support.federation import small_federation

ARCH = {
    "w": TensorSpec("w", (1000, 10), torch.float32),
    "b": TensorSpec("b", (10,), torch.float32),
}


def _config(**network: Any) -> Any:
    fed = small_federation(**network.pop("federation", {}))
    tls = {"enabled": False, "client_auth": False}
    net = {"rpc_timeout_s": 5, "auth": "insecure", "tls": tls, **network}
    return validate_mapping({"federation": fed, "network": net})


def test_the_cap_is_the_models_wire_size_per_quantization_not_512_mib() -> None:
    plain = payload_limits(_config(), ARCH)
    assert plain.model_bytes == plain.update_bytes == wire_bytes(ARCH)
    assert 40_040 < plain.model_bytes <= 40_040 + HEADER_ROOM + 1024
    int8 = payload_limits(_config(federation={"quantization": "int8"}), ARCH)
    assert int8.model_bytes == plain.model_bytes  # the global model always travels as float32
    assert int8.update_bytes < plain.update_bytes - 29_000  # 1 byte per value plus scales
    # Real payloads fit under it.
    params = {name: torch.zeros(spec.shape) for name, spec in ARCH.items()}
    meta = {"kind": "global-model", "version": "12", "model_hash": "sha256:" + "f" * 64}
    assert len(encode(params, meta)) <= plain.model_bytes


def test_a_config_may_lower_the_cap_but_never_below_the_wire_size() -> None:
    needed = payload_limits(_config(), ARCH).needed_bytes
    higher = payload_limits(_config(max_message_bytes=1 << 30), ARCH)
    assert higher.update_bytes == needed  # a larger config value does not raise the cap
    with pytest.raises(ConfigError) as caught:
        payload_limits(_config(max_message_bytes=20000), ARCH)
    text = str(caught.value)
    assert text.startswith("network.max_message_bytes: 20000 bytes is below")
    assert f"the {needed} bytes" in text and f"set at least {needed}" in text
    assert caught.value.exit_code == 2


def test_the_assembler_hashes_while_streaming_and_hands_out_its_buffer() -> None:
    data = bytes(range(256)) * 40
    assembler = Assembler(len(data), len(data), "the update")
    for start in range(0, len(data), 1000):
        assembler.add(data[start : start + 1000])
    assert assembler.payload_hash == bytes_hash(data)
    payload = assembler.finish()
    assert payload == data and isinstance(payload, bytes)
    with pytest.raises(TooLarge, match="declares 11 bytes, above the 10-byte cap"):
        Assembler(11, 10, "the update")
    short = Assembler(10, 10, "the update")
    short.add(b"12345")
    with pytest.raises(PayloadError, match="truncated: 5 of 10"):
        short.finish()


def test_allowances_bound_each_participant_and_one_upload_at_a_time() -> None:
    allowances = Allowances(3)
    assert allowances.take("alpha", "SubmitUpdate") is None
    assert "already has a SubmitUpdate" in str(allowances.take("alpha", "SubmitUpdate"))
    assert allowances.take("alpha", "WatchRounds") is None
    assert allowances.take("alpha", "FetchModel") is None
    assert "already holds 3 calls" in str(allowances.take("alpha", "WatchRounds"))
    assert allowances.take("bravo", "WatchRounds") is None  # others keep their own allowance
    allowances.give_back("alpha", "SubmitUpdate")
    assert allowances.take("alpha", "SubmitUpdate") is None
    assert pool_size(4, 3) == 4 * 3 + 8


class _Call:
    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()


def test_deadlines_cancel_late_calls_only() -> None:
    deadlines = Deadlines()
    try:
        late, done, extended = _Call(), _Call(), _Call()
        deadlines.arm(late, 0.05)
        handle = deadlines.arm(done, 0.05)
        deadlines.disarm(handle)
        moved = deadlines.arm(extended, 0.05)
        deadlines.extend(moved, extended, 30.0)
        assert late.cancelled.wait(5)
        deadlines_passed = time.monotonic() + 0.2
        while time.monotonic() < deadlines_passed:
            time.sleep(0.02)
        assert not done.cancelled.is_set() and not extended.cancelled.is_set()
    finally:
        deadlines.stop()


def test_the_metadata_check_refuses_a_missing_or_wrong_token_before_any_thread() -> None:
    config = _config(auth="token")
    auth = Authenticator(config, config.participant_ids, {"alpha": "a" * 20, "bravo": "b" * 20})
    good = {"authorization": "Bearer " + "a" * 20}
    assert auth.check("alpha", {}, good, certificate=False) is None
    assert auth.check("alpha", {}, {}, certificate=False) is not None
    assert auth.check("bravo", {}, good, certificate=False) is not None
    refusal = auth.check("", {}, good, certificate=False)
    assert refusal is not None and refusal.reason == "unknown_participant"


def _opening(round_index: int = 0) -> RoundOpening:
    return RoundOpening(round_index, 0, round_index, "sha256:" + "0" * 64, time.monotonic() + 60)


def _join_all(transport: GrpcCoordinatorTransport, ids: list[str]) -> None:
    for pid in ids:
        assert transport.join(pid, transport.config_hash, "{}", "x").accepted
        transport.presence_opened(pid)


def test_a_broken_presence_stream_closes_the_round_without_waiting() -> None:
    config = _config()
    transport = GrpcCoordinatorTransport(config, next_round=0)
    ids = sorted(config.participant_ids)
    _join_all(transport, ids)
    transport.open_round(_opening(), b"model")
    for pid in ids[:3]:
        submission = Submission(pid, 0, b"u", bytes_hash(b"u"), 0)
        transport.reply(submission, Verdict(Reason.ACCEPTED, "ok", 0))
    # The fourth is present: the collection goes on (receive returns at its deadline).
    assert transport.receive(time.monotonic() + 0.3) is None
    assert transport.absence_reasons() == {}
    transport.presence_closed(ids[3], broken=True)
    started = time.monotonic()
    assert transport.receive(time.monotonic() + 60) is None
    assert time.monotonic() - started < 5
    assert transport.absence_reasons() == {ids[3]: "disconnected"}
    # Back during the open attempt: still not waited for in it.
    _join_all(transport, ids[3:])
    assert transport.absence_reasons() == {ids[3]: "disconnected"}
    record = RoundRecord(
        round=0,
        attempt=0,
        state="closed",
        contributors=ids[:3],
        excluded={ids[3]: "disconnected"},
        parent_hash="",
        model_hash="sha256:" + "1" * 64,
        mean_inner_loss=None,
        bytes_up=0,
        bytes_down=0,
        quantization="none",
        wall_s=0.0,
        compute_s=0.0,
        non_compute_s=0.0,
        config_hash=transport.config_hash,
    )
    transport.round_closed(record)
    transport.open_round(_opening(1), b"model")
    assert transport.absence_reasons() == {}  # present at this opening: waited for


def test_below_quorum_the_round_keeps_waiting_and_a_normal_window_end_is_not_absence() -> None:
    config = _config()
    transport = GrpcCoordinatorTransport(config, next_round=0)
    ids = sorted(config.participant_ids)
    _join_all(transport, ids)
    transport.open_round(_opening(), b"model")
    transport.presence_closed(ids[0], broken=False)  # its window ended: grace to reopen
    for pid in ids[1:3]:
        transport.presence_closed(pid, broken=True)
    transport.reply(
        Submission(ids[3], 0, b"u", bytes_hash(b"u"), 0), Verdict(Reason.ACCEPTED, "", 0)
    )
    # alpha is within its grace; bravo and charlie are gone; 1 accepted < quorum 3: wait on.
    assert transport.receive(time.monotonic() + 0.3) is None
    assert transport.absence_reasons() == {ids[1]: "disconnected", ids[2]: "disconnected"}
    assert not transport._liveness.nobody_to_wait_for()
