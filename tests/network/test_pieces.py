"""Unit tests of the network transport's pieces: no processes, no rounds."""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import random
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from lensemble.config.load import validate_mapping
from lensemble.errors import ConfigError, PayloadError, UsageError
from lensemble.federation.spool import UpdateSpool
from lensemble.machinery.fresh_bytes import LARGE
from lensemble.network.coordinator.authenticator import Authenticator
from lensemble.network.participant.backoff import Backoff
from lensemble.network.participant.call_errors import Failure, classify
from lensemble.network.shared.certs import (
    certificate_identities,
    check_own_certificate,
    coordinator_names,
    init_certs,
)
from lensemble.network.shared.health import READINESS_SERVICE, HealthServer, check
from lensemble.network.shared.identity import identity_path, resolve_participant_id
from lensemble.network.shared.metrics import Metrics
from lensemble.network.shared.metrics_server import MetricsServer
from lensemble.network.shared.ready_announce import StdoutGuard, ready_line
from lensemble.network.shared.security import coordinator_tokens, participant_token
from lensemble.network.shared.streams import Assembler, TooLarge, chunk_count, chunks
from lensemble.network.shared.transport_errors import CURRENT_ROUND_KEY, REASON_KEY
from tests.support.network import network_mapping

TOKENS = {pid: f"{pid}-secret-token-0123456789" for pid in ("alpha", "bravo", "charlie", "delta")}


def _config(tmp_path: Path, **network: Any) -> Any:
    mapping = network_mapping(tmp_path)
    mapping["network"].update(network)
    return validate_mapping(mapping)


# ------------------------------------------------------------------------------------ backoff
def test_backoff_doubles_up_to_the_cap_with_jitter_in_the_upper_half() -> None:
    backoff = Backoff(cap_s=2.0, base_s=0.25, rng=random.Random(1))
    delays = [backoff.next_delay() for _ in range(8)]
    nominal = [0.25, 0.5, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    assert all(n / 2 <= d <= n for d, n in zip(delays, nominal, strict=True))
    assert len(set(delays)) == len(delays)  # jittered, not lockstep
    backoff.reset()
    assert backoff.next_delay() <= 0.25
    assert Backoff(cap_s=10, base_s=1).nominal(10_000) == 10  # no overflow for long outages


# ----------------------------------------------------------------------------------- identity
@pytest.fixture
def domains() -> Any:
    return validate_mapping(
        {
            "federation": {
                "participants": [
                    {"id": "alpine", "trust_domain": "labs"},
                    {"id": "coastal", "trust_domain": "robotics"},
                    {"id": "highland", "trust_domain": "labs"},
                ]
            }
        }
    )


def test_identity_precedence_flag_then_env_then_pod_name(domains: Any) -> None:
    env = {"LENSEMBLE_PARTICIPANT_ID": "coastal", "LENSEMBLE_POD_NAME": "site-0"}
    assert resolve_participant_id(domains, "highland", env) == "highland"
    assert resolve_participant_id(domains, None, env) == "coastal"
    assert resolve_participant_id(domains, None, {"LENSEMBLE_POD_NAME": "site-1"}) == "coastal"
    assert resolve_participant_id(domains, None, {"HOSTNAME": "lensemble-p-2"}) == "highland"


def test_pod_ordinal_counts_within_the_trust_domain_in_config_order(domains: Any) -> None:
    env = {"LENSEMBLE_POD_NAME": "labs-1", "LENSEMBLE_TRUST_DOMAIN": "labs"}
    assert resolve_participant_id(domains, None, env) == "highland"
    env["LENSEMBLE_POD_NAME"] = "labs-0"
    assert resolve_participant_id(domains, None, env) == "alpine"
    env["LENSEMBLE_POD_NAME"] = "labs-2"
    with pytest.raises(UsageError, match="ordinal 2, but trust domain 'labs' has only 2"):
        resolve_participant_id(domains, None, env)


@pytest.mark.parametrize(
    ("explicit", "env", "message"),
    [
        ("nobody", {}, "--id 'nobody' is not a participant"),
        (None, {"LENSEMBLE_PARTICIPANT_ID": "x"}, "LENSEMBLE_PARTICIPANT_ID 'x' is not a part"),
        (None, {"HOSTNAME": "laptop"}, "no participant id: pass --id"),
        (None, {"HOSTNAME": "a-0", "LENSEMBLE_TRUST_DOMAIN": "moon"}, "'moon' is not the trust"),
    ],
)
def test_identity_errors_name_the_source_and_the_fix(
    domains: Any, explicit: str | None, env: dict[str, str], message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        resolve_participant_id(domains, explicit, env)


def test_identity_paths_substitute_the_identity() -> None:
    assert identity_path("/etc/{identity}/tls.crt", "alpha") == "/etc/alpha/tls.crt"
    assert identity_path(None, "alpha") is None


# -------------------------------------------------------------------------------- certificates
def test_certs_init_writes_the_contract_layout_with_the_right_names(tmp_path: Path) -> None:
    config = _config(tmp_path, host="coord.example")
    issued = init_certs(tmp_path / "certs", config, ["10.9.8.7", "extra.example"])
    root = tmp_path / "certs"
    assert {p.name for p in root.iterdir()} == {"ca.crt", "ca.key", "coordinator", *TOKENS}
    for identity in ("coordinator", *TOKENS):
        assert {p.name for p in (root / identity).iterdir()} == {"tls.crt", "tls.key", "ca.crt"}
        assert (root / identity / "tls.key").stat().st_mode & 0o777 == 0o600
    assert (root / "ca.key").stat().st_mode & 0o777 == 0o600
    server = certificate_identities((root / "coordinator" / "tls.crt").read_bytes())
    expected = {"coord.example", "coordinator", "nettest-coordinator", "localhost", "127.0.0.1"}
    assert expected | {"10.9.8.7", "extra.example"} <= server
    assert issued.server_names[:5] == coordinator_names(config)[:5]
    alpha = x509.load_pem_x509_certificate((root / "alpha" / "tls.crt").read_bytes())
    assert certificate_identities((root / "alpha" / "tls.crt").read_bytes()) == {"alpha"}
    ca = x509.load_pem_x509_certificate((root / "ca.crt").read_bytes())
    alpha.verify_directly_issued_by(ca)
    usage = alpha.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert [u.dotted_string for u in usage] == ["1.3.6.1.5.5.7.3.2"]  # clientAuth only
    # A second run reuses the CA, so certificates issued before stay valid.
    again = init_certs(root, config)
    assert again.ca_reused and (root / "ca.crt").read_bytes() == ca.public_bytes(Encoding.PEM)


def test_a_participant_refuses_to_start_with_another_participants_certificate(
    tmp_path: Path,
) -> None:
    init_certs(tmp_path, _config(tmp_path))
    check_own_certificate(tmp_path / "alpha" / "tls.crt", "alpha")
    with pytest.raises(ConfigError, match="issued to bravo, not to participant 'alpha'"):
        check_own_certificate(tmp_path / "bravo" / "tls.crt", "alpha")
    with pytest.raises(ConfigError, match="not a readable PEM certificate"):
        check_own_certificate(tmp_path / "missing.crt", "alpha")


# ------------------------------------------------------------------------------ authentication
def test_mtls_identity_is_the_certificate_never_the_claim(tmp_path: Path) -> None:
    auth = Authenticator(_config(tmp_path), list(TOKENS))
    alpha_cert = {"x509_common_name": [b"alpha"], "x509_subject_alternative_name": [b"alpha"]}
    assert auth.check("alpha", alpha_cert, {}) is None
    refused = auth.check("bravo", alpha_cert, {})
    assert refused is not None and refused.reason == "bad_credentials"
    assert "(alpha) does not identify participant 'bravo'" in refused.message
    assert auth.check("alpha", {}, {}) is not None  # no verified certificate at all
    unknown = auth.check("mallory", alpha_cert, {})
    assert unknown is not None and unknown.reason == "unknown_participant"


def test_token_auth_reads_tokens_from_files_or_env_never_the_config(tmp_path: Path) -> None:
    folder = tmp_path / "tokens"
    folder.mkdir()
    (folder / "coordinator").write_text(
        "# id token\n" + "\n".join(f"{p} {t}" for p, t in TOKENS.items()) + "\n"
    )
    (folder / "alpha").write_text(TOKENS["alpha"] + "\n")
    config = _config(
        tmp_path,
        auth="token",
        tls={**network_mapping(tmp_path)["network"]["tls"], "client_auth": False},
        token_file=str(folder / "{identity}"),
    )
    tokens = coordinator_tokens(config, env={})
    assert tokens == TOKENS
    assert participant_token(config, "alpha", env={}) == TOKENS["alpha"]
    auth = Authenticator(config, list(TOKENS), tokens)
    good = {"authorization": f"Bearer {TOKENS['alpha']}"}
    assert auth.check("alpha", {}, good) is None
    wrong = auth.check("bravo", {}, good)
    assert wrong is not None and wrong.reason == "bad_credentials"
    assert auth.check("alpha", {}, {}) is not None
    # From the environment when no file is configured.
    env_config = _config(
        tmp_path,
        auth="token",
        tls={**network_mapping(tmp_path)["network"]["tls"], "client_auth": False},
    )
    env = {"LENSEMBLE_TOKEN": ",".join(f"{p} {t}" for p, t in TOKENS.items())}
    assert coordinator_tokens(env_config, env=env) == TOKENS
    with pytest.raises(ConfigError, match="needs a bearer token"):
        participant_token(env_config, "alpha", env={})
    with pytest.raises(ConfigError, match="at least 16 characters"):
        participant_token(env_config, "alpha", env={"LENSEMBLE_TOKEN": "short"})
    with pytest.raises(ConfigError, match="no token for charlie, delta"):
        coordinator_tokens(
            env_config, env={"LENSEMBLE_TOKEN": env["LENSEMBLE_TOKEN"].rsplit(",", 2)[0]}
        )
    with pytest.raises(ConfigError, match="entry 1 is not '<participant-id> <token>'"):
        coordinator_tokens(env_config, env={"LENSEMBLE_TOKEN": "mallory xxxxxxxxxxxxxxxxxxxxxx"})


# --------------------------------------------------------------------------------- streams
def test_chunks_cover_the_payload_exactly() -> None:
    data = bytes(range(256)) * 10
    parts = list(chunks(data, 1000))
    assert [len(p) for p in parts] == [1000, 1000, 560]
    assert b"".join(parts) == data and len(parts) == chunk_count(len(data), 1000)
    assert [bytes(p) for p in chunks(b"", 10)] == [b""] and chunk_count(0, 10) == 1


def test_max_message_bytes_is_enforced_before_and_while_buffering() -> None:
    with pytest.raises(TooLarge, match="declares 2049 bytes, above the 2048-byte cap"):
        Assembler(2049, 2048, "the update")
    assembler = Assembler(100, 2048, "the update")
    assembler.add(b"x" * 60)
    with pytest.raises(PayloadError, match="sent more than the 100 bytes it declared"):
        assembler.add(b"x" * 41)
    assert assembler.received == 60  # the refused chunk was not kept
    with pytest.raises(PayloadError, match="truncated: 60 of 100"):
        assembler.finish()
    assembler.add(b"y" * 40)
    assert assembler.finish() == b"x" * 60 + b"y" * 40


def _assembled(data: bytes) -> Assembler:
    assembler = Assembler(len(data), len(data), "the update")
    for part in chunks(data, 1 << 20):
        assembler.add(part)
    return assembler


def test_a_large_stream_is_assembled_into_the_released_payload_of_the_last_one() -> None:
    size = LARGE + 12345
    first_data, second_data = os.urandom(size), os.urandom(size)
    first = _assembled(first_data).finish()
    first_id = id(first)
    del first
    second_assembler = _assembled(second_data)
    second = second_assembler.finish()
    assert id(second) == first_id  # written over, not faulted in anew
    assert second == second_data
    assert second_assembler.payload_hash == "sha256:" + hashlib.sha256(second_data).hexdigest()
    # Held (by a view, as the coordinator's decode holds it): the next stream gets its own.
    view = memoryview(second)
    third = _assembled(first_data).finish()
    assert id(third) != first_id and third == first_data and bytes(view) == second_data


def test_a_large_update_stream_lands_in_the_spool_and_a_small_one_stays_in_memory() -> None:
    folder = Path("/dev/shm") / f"lensemble-assembler-{os.getpid()}"
    spool = UpdateSpool(folder, memory_budget=0)
    try:
        large, small = os.urandom(LARGE + 1), os.urandom(LARGE - 1)
        for data, lands in ((large, True), (small, False)):
            assembler = Assembler(len(data), len(data), "the update", land=spool.land)
            for part in chunks(data, 1 << 16):
                assembler.add(part)
            payload = assembler.finish()
            assert (assembler.landing is not None) is lands
            assert isinstance(payload, memoryview if lands else bytes) and payload == data
            assert assembler.payload_hash == "sha256:" + hashlib.sha256(data).hexdigest()
            del payload, assembler
        assert len(spool._free) == 1  # nobody kept the landed one: its file is free again
    finally:
        spool.close()
        folder.rmdir()


# --------------------------------------------------------------------- classification of errors
class _FakeError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, reason: str | None = None) -> None:
        self._code = code
        self._trailing = [(REASON_KEY, reason), (CURRENT_ROUND_KEY, "4")] if reason else []

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "details"

    def trailing_metadata(self) -> Any:
        return self._trailing


@pytest.mark.parametrize(
    ("code", "reason", "kind"),
    [
        (grpc.StatusCode.UNAVAILABLE, None, Failure.TRANSIENT),
        (grpc.StatusCode.DEADLINE_EXCEEDED, None, Failure.TRANSIENT),
        (grpc.StatusCode.UNAVAILABLE, "busy", Failure.TRANSIENT),
        (grpc.StatusCode.FAILED_PRECONDITION, "stale_session", Failure.STALE_SESSION),
        (grpc.StatusCode.FAILED_PRECONDITION, "closed_round", Failure.ROUND_LOST),
        (grpc.StatusCode.PERMISSION_DENIED, "bad_credentials", Failure.DENIED),
        (grpc.StatusCode.INVALID_ARGUMENT, "non_finite", Failure.REJECTED),
        (grpc.StatusCode.ALREADY_EXISTS, "conflicting_duplicate", Failure.REJECTED),
    ],
)
def test_failures_are_classified_by_status_and_reason_not_text(
    code: grpc.StatusCode, reason: str | None, kind: Failure
) -> None:
    error = classify(_FakeError(code, reason))
    assert error.kind == kind
    assert error.reason == (reason or code.name.lower())
    assert error.current_round == (4 if reason else -1)


# -------------------------------------------------------------------------------- ready line
def test_ready_line_is_one_json_object_with_the_contract_fields() -> None:
    line = ready_line(
        role="participant",
        participant_id="alpha",
        endpoint="127.0.0.1:50051",
        config_hash="sha256-canon-v1:" + "0" * 64,
        health_port=1234,
        metrics_port=5678,
    )
    assert "\n" not in line
    fields = json.loads(line)
    assert fields["event"] == "ready" and fields["role"] == "participant"
    assert {"participant_id", "endpoint", "config_hash", "version"} <= set(fields)
    assert (fields["health_port"], fields["metrics_port"]) == (1234, 5678)


def test_stdout_guard_sends_stray_output_to_stderr_and_emits_one_line(tmp_path: Path) -> None:
    code = (
        "import os, sys\n"
        "from lensemble.network.shared.ready_announce import StdoutGuard\n"
        "guard = StdoutGuard(); guard.claim()\n"
        "print('stray python print'); sys.stdout.flush(); os.write(1, b'stray C write\\n')\n"
        'guard.emit(\'{"event": "ready"}\')\n'
        "print('after'); sys.stdout.flush()\n"
        "try:\n    guard.emit('again')\nexcept RuntimeError:\n    print('refused twice', file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert proc.stdout == '{"event": "ready"}\n'
    assert "stray python print" in proc.stderr and "stray C write" in proc.stderr
    assert "after" in proc.stderr and "refused twice" in proc.stderr


def test_stdout_guard_without_claim_writes_to_sys_stdout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    guard = StdoutGuard()
    guard.emit('{"event": "ready"}')
    assert capsys.readouterr().out == '{"event": "ready"}\n'


# ------------------------------------------------------------------------- health and metrics
def test_health_reports_liveness_and_readiness_separately() -> None:
    server = HealthServer("127.0.0.1", 0)
    try:
        assert server.port > 0
        assert check("127.0.0.1", server.port, "", 5) == "SERVING"
        assert check("127.0.0.1", server.port, READINESS_SERVICE, 5) == "NOT_SERVING"
        server.set_ready(True)
        assert check("127.0.0.1", server.port, READINESS_SERVICE, 5) == "SERVING"
        assert check("127.0.0.1", server.port, "other", 5).startswith("UNREACHABLE: NOT_FOUND")
    finally:
        server.stop()
    assert check("127.0.0.1", server.port, "", 1).startswith("UNREACHABLE")
    with pytest.raises(UsageError, match="cannot listen on"):
        HealthServer("203.0.113.1", 0)  # not a local address


def test_metrics_are_served_only_at_the_configured_path() -> None:
    metrics = Metrics()
    metrics.verdict(False, "non_finite")
    metrics.verdict(True, "accepted")
    server = MetricsServer(metrics.registry, "127.0.0.1", 0, "/custom")
    try:
        url = f"http://127.0.0.1:{server.port}"
        with urllib.request.urlopen(url + "/custom", timeout=5) as response:
            body = response.read().decode()
        assert 'lensemble_rejected_submissions_total{reason="non_finite"} 1.0' in body
        assert "lensemble_accepted_submissions_total 1.0" in body
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(url + "/metrics", timeout=5)
        assert info.value.code == 404
        with pytest.raises(UsageError, match="cannot serve metrics"):
            MetricsServer(metrics.registry, "127.0.0.1", server.port, "/custom")
    finally:
        server.stop()


def test_insecure_mode_logs_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from lensemble.network.shared.security import warn_if_insecure

    config = _config(tmp_path, auth="insecure", tls={"enabled": False})
    with caplog.at_level(logging.WARNING, logger="lensemble"):
        warn_if_insecure(config)
    assert "participants are not authenticated" in caplog.text
    assert "travel unencrypted" in caplog.text


def test_the_network_coordinator_drops_a_built_theta0_once_it_has_its_own_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # theta_0 is a model's worth of memory that nothing needs after the coordinator copied it:
    # once the coordinator is built (before any round), no tensor of it may be alive.
    from lensemble.network.launch import process
    from tests.support.federation import initial_params

    built: list[weakref.ref[torch.Tensor]] = []

    def build() -> dict[str, torch.Tensor]:
        params = initial_params(3)
        built.extend(weakref.ref(tensor) for tensor in params.values())
        return params

    alive: list[str] = []

    class Stop(Exception):
        pass

    def built_coordinator(*_args: object, **_kwargs: object) -> None:
        gc.collect()
        alive.extend(str(ref) for ref in built if ref() is not None)
        raise Stop

    monkeypatch.setattr(process, "_say_if_resumed", built_coordinator)
    config = _config(tmp_path, auth="insecure", tls={"enabled": False})
    with pytest.raises(Stop):
        process.run_coordinator(config, build)
    assert built, "the builder was never called"
    assert not alive, f"theta_0 is still held while the coordinator runs: {alive}"


class _DroppedStream(grpc.RpcError):  # type: ignore[misc]
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "Stream removed"

    def trailing_metadata(self) -> tuple[()]:
        return ()


class _PresenceCall:
    """One Presence stream: ``beats`` beats, then it fails (``fail``), ends, or stops ``stop``."""

    def __init__(self, beats: int, fail: bool, stop: Any) -> None:
        self.beats, self.fail, self.stop = beats, fail, stop

    def __iter__(self) -> Any:
        for _ in range(self.beats):
            yield object()
        if self.fail:
            raise _DroppedStream()
        if self.stop is not None:
            self.stop.set()

    def cancel(self) -> None:
        pass


def test_presence_logs_present_once_at_the_first_beat_after_a_broken_stream(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Tests (and operators) wait on this event to know the coordinator counts the participant
    # again after a cut; it must not fire for a healthy first stream or for every beat.
    from lensemble.network.participant.client import CoordinatorClient

    config = _config(tmp_path, auth="insecure", tls={"enabled": False})
    client = CoordinatorClient(config, "alpha")
    # Short pauses between streams (min(1 s, the RPC deadline)): the config's floor is 0.5 s.
    client.timeout_s = 0.01
    stop = threading.Event()
    streams = [
        _PresenceCall(2, fail=False, stop=None),  # ends at its window: not a failure
        _PresenceCall(1, fail=True, stop=None),
        _PresenceCall(0, fail=True, stop=None),  # the link is still down
        _PresenceCall(3, fail=False, stop=stop),
    ]
    opened: list[_PresenceCall] = []

    class _Stub:
        def Presence(self, *_args: Any, **_kwargs: Any) -> _PresenceCall:
            opened.append(streams[len(opened)])
            return opened[-1]

    client.stub = _Stub()  # type: ignore[assignment]
    try:
        with caplog.at_level(logging.INFO, logger="lensemble"):
            client.hold_presence(stop)
    finally:
        client.close()
    assert opened == streams
    present = [r for r in caplog.records if getattr(r, "event", None) == "present"]
    assert len(present) == 1 and "counts this participant again" in present[0].getMessage()
