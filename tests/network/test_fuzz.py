"""Malformed SubmitUpdate streams against a live coordinator: classified, bounded, harmless.

A seeded generator sends 10,000 broken update streams (truncated, bad safetensors header,
oversized declared length, more bytes than declared, wrong round, wrong or unknown participant,
stale session, NaN/Inf, wrong dtype, hash mismatch, ...) over one mTLS channel while a round is
open. Every stream must be refused with its own status and reason, the coordinator must keep
serving with bounded memory, and the round must then commit exactly the hash an in-process run
commits.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import torch

from lensemble.config import LensembleConfig
from lensemble.config.load import validate_mapping
from lensemble.federation.ledger import committed_chain
from lensemble.federation.messages import RoundOpening
from lensemble.federation.participant import Contribution, Participant
from lensemble.federation.payload import bytes_hash, encode, manifest
from lensemble.network.participant.client import CoordinatorClient, coordinator_target
from lensemble.network.shared.grpc_options import message_options
from lensemble.network.shared.identity import PARTICIPANT_KEY
from lensemble.network.shared.payload_limits import wire_bytes
from lensemble.network.shared.proto import lensemble_pb2 as pb
from lensemble.network.shared.proto import lensemble_pb2_grpc as pb_grpc
from lensemble.network.shared.security import channel_credentials
from lensemble.network.shared.transport_errors import (
    CURRENT_ROUND_KEY,
    REASON_KEY,
    TOO_MANY_CALLS,
)
from tests.support.federation import QuadraticLearner, build, initial_params
from tests.support.network import (
    LiveCoordinator,
    ParticipantThread,
    network_mapping,
    write_config,
)

STREAMS = 10_000
#: The coordinator's update cap: the test model's wire size plus header room.
MAX_BYTES = wire_bytes(manifest(initial_params(3)))
Stream = list[pb.UpdateChunk]
Expectation = tuple[grpc.StatusCode, str]


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _wait(predicate: Callable[[], bool], timeout_s: float = 30) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.02)


def _submit_once_free(
    client: CoordinatorClient, opening: RoundOpening, contribution: Contribution
) -> pb.SubmitReply:
    """``client.submit``, again while the coordinator still counts an earlier call of its own.

    The fuzz's last stream may have its status before the coordinator's handler gave its
    allowance back; a participant treats that refusal as transient and retries
    (``network.participant.call_errors``), and so does this.
    """
    end = time.monotonic() + 30
    while True:
        try:
            return client.submit(opening, contribution)
        except grpc.RpcError as exc:
            trailing = dict(exc.trailing_metadata() or ())
            if trailing.get(REASON_KEY) != TOO_MANY_CALLS or time.monotonic() > end:
                raise
            time.sleep(0.05)


class Mutator:
    """Builds one malformed update stream of each kind from a valid contribution."""

    def __init__(self, header: pb.UpdateHeader, payload: bytes, metadata: dict[str, str]) -> None:
        self.header = header
        self.payload = payload
        self.metadata = metadata
        params = initial_params(3)
        self.shapes = {k: tuple(v.shape) for k, v in params.items()}

    def _stream(self, payload: bytes, chunk: int = 4096, **header: object) -> Stream:
        head = pb.UpdateHeader()
        head.CopyFrom(self.header)
        head.total_bytes = len(payload)
        head.payload_hash = bytes_hash(payload)
        for key, value in header.items():
            setattr(head, key, value)
        parts = [payload[i : i + chunk] for i in range(0, len(payload), chunk)] or [b""]
        return [pb.UpdateChunk(header=head, data=parts[0])] + [
            pb.UpdateChunk(data=p) for p in parts[1:]
        ]

    def _tensors(self, dtype: torch.dtype, fill: float | None, rng: random.Random) -> bytes:
        tensors = {}
        for name, shape in self.shapes.items():
            t = torch.randn(shape, generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
            if fill is not None:
                t.view(-1)[rng.randrange(t.numel())] = fill
            tensors[name] = t.to(dtype)
        return encode(tensors, self.metadata)

    def make(self, kind: str, rng: random.Random) -> tuple[Stream, Expectation]:
        p = self.payload
        invalid, denied, failed = (
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.PERMISSION_DENIED,
            grpc.StatusCode.FAILED_PRECONDITION,
        )
        if kind == "truncated":
            cut = rng.randrange(len(p))
            stream = self._stream(
                p[:cut], rng.randrange(1, 300), total_bytes=len(p), payload_hash=bytes_hash(p)
            )
            return stream, (invalid, "bad_payload")
        if kind == "overlong":
            extra = rng.randbytes(rng.randrange(1, 500))
            # The excess arrives in the last chunk (an aio client cannot see the coordinator's
            # status when it is refused while still writing).
            stream = self._stream(p, rng.randrange(1, 300), total_bytes=len(p))
            stream.append(pb.UpdateChunk(data=extra))
            return stream, (invalid, "bad_payload")
        if kind == "oversized_declared":
            declared = MAX_BYTES + 1 + rng.randrange(1 << 40)
            return self._stream(p[:100], total_bytes=declared), (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "too_large",
            )
        if kind == "bad_header_length":
            bad = rng.randbytes(8) + p[8:]
            return self._stream(bad), (invalid, "bad_payload")
        if kind == "bad_header_json":
            at = rng.randrange(8, 8 + 40)
            bad = p[:at] + bytes([p[at] ^ 0xFF]) + p[at + 1 :]
            return self._stream(bad), (invalid, "bad_payload")
        if kind == "random_bytes":
            return self._stream(rng.randbytes(rng.randrange(0, 2000))), (invalid, "bad_payload")
        if kind == "no_header":
            return [pb.UpdateChunk(data=p)], (invalid, "bad_payload")
        if kind == "second_header":
            stream = self._stream(p)
            stream.append(pb.UpdateChunk(header=self.header, data=b""))
            return stream, (invalid, "bad_payload")
        if kind == "wrong_round":
            other = rng.choice([-5, 1, 2, 7, 1 << 40])
            return self._stream(p, round_index=other), (failed, "closed_round")
        if kind == "wrong_attempt":
            return self._stream(p, attempt=rng.randrange(1, 100)), (failed, "closed_round")
        if kind == "wrong_participant":
            who = rng.choice(["bravo", "charlie", "delta"])
            return self._stream(p, participant_id=who), (denied, "bad_credentials")
        if kind == "unknown_participant":
            return self._stream(p, participant_id=f"mallory-{rng.randrange(99)}"), (
                denied,
                "unknown_participant",
            )
        if kind == "stale_session":
            return self._stream(p, session=rng.randbytes(8).hex()), (failed, "stale_session")
        if kind == "wrong_quantization":
            return self._stream(p, quantization="int8"), (invalid, "bad_payload")
        if kind == "hash_mismatch":
            wrong = "sha256:" + rng.randbytes(32).hex()
            return self._stream(p, payload_hash=wrong), (invalid, "hash_mismatch")
        if kind == "nan_inf":
            fill = rng.choice([float("nan"), float("inf"), float("-inf")])
            return self._stream(self._tensors(torch.float32, fill, rng)), (invalid, "non_finite")
        if kind == "wrong_dtype":
            dtype = rng.choice([torch.float64, torch.float16, torch.bfloat16, torch.int32])
            return self._stream(self._tensors(dtype, None, rng)), (
                invalid,
                "architecture_mismatch",
            )
        raise AssertionError(kind)


KINDS = (
    "truncated",
    "overlong",
    "oversized_declared",
    "bad_header_length",
    "bad_header_json",
    "random_bytes",
    "no_header",
    "second_header",
    "wrong_round",
    "wrong_attempt",
    "wrong_participant",
    "unknown_participant",
    "stale_session",
    "wrong_quantization",
    "hash_mismatch",
    "nan_inf",
    "wrong_dtype",
)


async def _fuzz(config: LensembleConfig, mutator: Mutator, rng: random.Random) -> Counter[str]:
    """Send the malformed streams one after another (grpc.aio: no thread per stream)."""
    seen: Counter[str] = Counter()
    credentials = channel_credentials(config, "alpha", None)
    target = coordinator_target(config)
    async with grpc.aio.secure_channel(target, credentials, options=message_options(config)) as ch:
        stub = pb_grpc.CoordinatorStub(ch)
        for i in range(STREAMS):
            kind = KINDS[i % len(KINDS)] if i < len(KINDS) else rng.choice(KINDS)
            stream, (code, reason) = mutator.make(kind, rng)
            call = stub.SubmitUpdate(timeout=10, metadata=((PARTICIPANT_KEY, "alpha"),))
            try:
                for chunk in stream:
                    await call.write(chunk)
                await call.done_writing()
            except (asyncio.InvalidStateError, grpc.aio.AioRpcError):
                pass  # the coordinator refused before the end of the stream
            got_code = await call.code()
            got = dict(await call.trailing_metadata() or ()).get(REASON_KEY)
            assert got_code != grpc.StatusCode.OK, f"malformed stream {kind!r} was accepted"
            assert (got_code, got) == (code, reason), (kind, got_code, got, await call.details())
            seen[kind] += 1
    return seen


@pytest.mark.slow
def test_ten_thousand_malformed_streams_are_refused_and_change_nothing(tmp_path: Path) -> None:
    mapping = network_mapping(
        tmp_path,
        rounds=1,
        round_timeout_s=600,
        join_timeout_s=600,
    )
    mapping["network"]["chunk_bytes"] = 4096
    _, config = write_config(tmp_path, mapping)
    honest: list[ParticipantThread] = []
    with LiveCoordinator(config) as live:
        honest = [ParticipantThread(config, pid) for pid in ("bravo", "charlie")]
        # delta is present but submits only after the fuzz: a round closes as soon as every
        # present participant was judged, and the fuzz gets alpha judged (rejected) at once.
        late = CoordinatorClient(config, "delta")
        client = CoordinatorClient(config, "alpha")
        present = threading.Event()
        try:
            # Present like real participants: the round waits for their updates.
            for joining in (client, late):
                assert joining.join().accepted
                threading.Thread(target=joining.hold_presence, args=(present,), daemon=True).start()
            announcement = client.watch((-1, 1 << 30))
            assert announcement is not None and announcement.round_index == 0
            _wait(lambda: live.metrics.accepted._value.get() == 2)  # bravo and charlie are in
            payload = client.fetch(announcement)
            opening = RoundOpening(0, 0, 0, announcement.model_hash, time.monotonic() + 600)
            alpha = Participant(
                config, "alpha", QuadraticLearner("alpha", 3), manifest(initial_params(3))
            )
            contribution = alpha.contribute(opening, payload)
            header = pb.UpdateHeader(
                participant_id="alpha",
                session=client.session,
                round_index=0,
                attempt=0,
                payload_hash=contribution.payload_hash,
                quantization="none",
                total_bytes=len(contribution.payload),
            )
            from lensemble.federation.payload import decode

            mutator = Mutator(header, contribution.payload, decode(contribution.payload).metadata)
            rng = random.Random(20261129)
            rss_before = _rss_bytes()
            start = time.perf_counter()
            # A loop of its own, not asyncio.run: that leaves the process with no current loop,
            # and the Pulumi mocks a later test of the same process runs need one.
            loop = asyncio.new_event_loop()
            try:
                seen = loop.run_until_complete(_fuzz(config, mutator, rng))
            finally:
                loop.close()
            elapsed = time.perf_counter() - start
            rss_growth = _rss_bytes() - rss_before
            print(
                f"{STREAMS} malformed streams in {elapsed:.1f} s; RSS growth {rss_growth / 1e6:.1f} MB"
            )
            assert sum(seen.values()) == STREAMS and set(seen) == set(KINDS)
            # Bounded memory: nothing of the refused streams is kept.
            assert rss_growth < 64 * 1024 * 1024, rss_growth
            # Still serving, round still open, nothing committed by the noise.
            assert live.thread.is_alive() and live.coordinator.version == 0
            reply = _submit_once_free(client, opening, contribution)
            assert reply.accepted and reply.reason == "accepted"
            delta = Participant(
                config, "delta", QuadraticLearner("delta", 3), manifest(initial_params(3))
            )
            reply = late.submit(opening, delta.contribute(opening, late.fetch(announcement)))
            assert reply.accepted and reply.reason == "accepted"
            live.thread.join(30)
            assert live.error is None and live.result is not None
            # After the commit: a resend of the counted bytes is an idempotent duplicate, other
            # bytes for the closed round are refused naming the current round.
            again = client.submit(opening, contribution)
            assert again.accepted and again.reason == "duplicate"
            stream, _ = mutator.make("nan_inf", rng)
            try:
                client.stub.SubmitUpdate(iter(stream), timeout=10, metadata=client.metadata)
            except grpc.RpcError as exc:
                trailing = dict(exc.trailing_metadata() or ())
                assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert (trailing[REASON_KEY], trailing[CURRENT_ROUND_KEY]) == ("closed_round", "1")
            else:
                raise AssertionError("an update for a closed round was accepted")
        finally:
            present.set()
            client.close()
            late.close()
            for h in honest:
                h.close()
    # The committed hash equals an in-process run of the same config and seed.
    in_process = dict(mapping, federation={**mapping["federation"], "transport": "in_process"})
    reference, transport, _ = build(validate_mapping(in_process))
    assert committed_chain(live.result.records) == committed_chain(reference.run(transport).records)
    counted = live.metrics.rejected
    assert counted.labels(reason="too_large")._value.get() >= 1
    assert counted.labels(reason="bad_credentials")._value.get() >= 1
