"""The tamper-evident run record: every tampering is found before any work, with its line named."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path

import pytest
import torch

from lensemble.errors import IntegrityError, UsageError
from lensemble.federation.checkpoint import MOMENTUM_PREFIX, CheckpointStore, state_hash
from lensemble.federation.ledger import Ledger, canonical, line_digest
from lensemble.federation.payload import decode, encode, model_hash
from lensemble.federation.record_keys import require_matching_key
from lensemble.federation.signing import HmacSigner
from lensemble.federation.verify import verify_run
from tests.support.cli import run_cli
from tests.support.federation import build, small_config

HASH = re.compile(r"sha256:[0-9a-f]{64}")
KEY = b"k" * 32


def _run(out: Path, rounds: int = 3, signer: HmacSigner | None = None) -> str:
    coordinator, transport, _ = build(small_config(rounds=rounds), output_dir=out)
    if signer is not None:  # re-create with the key: the first checkpoint is signed too
        from lensemble.federation.coordinator import Coordinator
        from tests.support.federation import initial_params

        coordinator = Coordinator(
            small_config(rounds=rounds), initial_params(3), output_dir=out, signer=signer
        )
    return coordinator.run(transport).model_hash


def _lines(out: Path) -> list[dict]:
    return [json.loads(t) for t in (out / "ledger.jsonl").read_text().splitlines()]


def _write_lines(out: Path, lines: list[dict]) -> None:
    (out / "ledger.jsonl").write_text("".join(canonical(b) + "\n" for b in lines))


def _resume_refused(out: Path, rounds: int = 5) -> str:
    """Resume must refuse before any training or write; returns the error message."""
    ledger_before = (out / "ledger.jsonl").read_bytes()
    ckpts_before = sorted(p.name for p in CheckpointStore(out).folder.iterdir())
    with pytest.raises(IntegrityError) as caught:
        build(small_config(rounds=rounds), output_dir=out, resume=True)
    assert (out / "ledger.jsonl").read_bytes() == ledger_before
    assert sorted(p.name for p in CheckpointStore(out).folder.iterdir()) == ckpts_before
    return caught.value.message


def test_an_honest_run_verifies_and_keeps_its_model_hash_chain(tmp_path: Path) -> None:
    final = _run(tmp_path)
    report = verify_run(tmp_path)
    assert report.ok and report.lines == 3 and report.committed == 3
    assert report.model_hash == final and report.checkpoints == [1, 2, 3]
    lines = _lines(tmp_path)
    assert [b["seq"] for b in lines] == [1, 2, 3]
    assert lines[1]["prev"] == lines[0]["line_hash"] and lines[0]["prev"] == ""
    record = lines[0]["record"]
    assert record["aggregator"] == "canonical-mean" and record["software"].startswith("lensemble")
    assert set(record["updates"]) == set(record["contributors"])
    assert all(HASH.fullmatch(u["hash"]) and u["bytes"] > 0 for u in record["updates"].values())
    assert record["opened_at"] <= record["closed_at"]
    result = run_cli("verify", str(tmp_path), "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["ok"] is True


def test_a_consistently_forged_checkpoint_is_refused_before_training(tmp_path: Path) -> None:
    _run(tmp_path)
    store = CheckpointStore(tmp_path)
    path = store.path(3)
    decoded = decode(path.read_bytes())
    meta = dict(decoded.metadata)
    tensors = dict(decoded.tensors)
    name = sorted(k for k in tensors if not k.startswith(MOMENTUM_PREFIX))[0]
    tensors[name] = tensors[name] + 1.0
    params = {k: v for k, v in tensors.items() if not k.startswith(MOMENTUM_PREFIX)}
    momentum = {
        k.removeprefix(MOMENTUM_PREFIX): v
        for k, v in tensors.items()
        if k != name and k.startswith(MOMENTUM_PREFIX)
    }
    meta["model_hash"] = model_hash(params, 3, meta["parent_hash"])
    meta["state_hash"] = state_hash(
        params,
        momentum,
        version=3,
        model_hash_=meta["model_hash"],
        parent_hash=meta["parent_hash"],
        config_hash=meta["config_hash"],
        record_json=meta["record"],
    )
    path.write_bytes(encode(tensors, meta))
    message = _resume_refused(tmp_path)
    assert "ledger.jsonl:3" in message
    found = HASH.findall(message)
    assert len(found) == 2 and found[0] != found[1]  # both full hashes, and they differ
    result = run_cli("verify", str(tmp_path))
    assert result.code == 3 and "ledger.jsonl:3" in result.out


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("model_hash", "sha256:" + "0" * 64),
        ("contributors", ["alpha"]),
        ("excluded", {"alpha": "timeout"}),
        ("mean_inner_loss", 0.5),
        ("robustness_note", "added later by another writer"),  # fields the code does not know
    ],
)
def test_an_edited_ledger_line_is_named_with_both_full_hashes(
    tmp_path: Path, field: str, value: object
) -> None:
    _run(tmp_path)
    lines = _lines(tmp_path)
    lines[1]["record"][field] = value
    _write_lines(tmp_path, lines)
    message = _resume_refused(tmp_path)
    assert "ledger.jsonl:2" in message and "was edited" in message
    expected, found = HASH.findall(message)
    assert expected == lines[1]["line_hash"] and found == line_digest(lines[1])


def test_a_rehashed_edit_is_named_at_its_line_or_breaks_the_next_link(tmp_path: Path) -> None:
    _run(tmp_path)
    lines = _lines(tmp_path)
    original = canonical(lines[0]["record"])
    lines[0]["record"]["excluded"] = {"delta": "timeout"}
    lines[0]["line_hash"] = line_digest(lines[0])
    _write_lines(tmp_path, lines)
    # The checkpoint line 1 commits holds the original record: line 1 itself is named first.
    message = _resume_refused(tmp_path)
    assert "ledger.jsonl:1" in message and "another round record" in message
    expected, found = HASH.findall(message)
    assert expected == "sha256:" + hashlib.sha256(original.encode()).hexdigest() != found
    # Without that checkpoint, the next line's link to it breaks.
    CheckpointStore(tmp_path).path(1).unlink()
    message = _resume_refused(tmp_path)
    assert "ledger.jsonl:2" in message and "does not chain" in message


def test_a_bit_flip_in_the_outer_momentum_is_refused(tmp_path: Path) -> None:
    _run(tmp_path)
    path = CheckpointStore(tmp_path).path(3)
    decoded = decode(path.read_bytes())
    tensors = dict(decoded.tensors)
    name = sorted(k for k in tensors if k.startswith(MOMENTUM_PREFIX))[0]
    flipped = tensors[name].clone().view(torch.int32)
    flipped.view(-1)[0] ^= 1
    tensors[name] = flipped.view(torch.float32)
    path.write_bytes(encode(tensors, dict(decoded.metadata)))
    message = _resume_refused(tmp_path)
    assert "state hash" in message and "model-v000003" in message


def test_a_checkpoint_without_momentum_is_an_integrity_error_not_a_traceback(
    tmp_path: Path,
) -> None:
    _run(tmp_path)
    path = CheckpointStore(tmp_path).path(3)
    decoded = decode(path.read_bytes())
    params = {k: v for k, v in decoded.tensors.items() if not k.startswith(MOMENTUM_PREFIX)}
    path.write_bytes(encode(params, dict(decoded.metadata)))
    assert "lacks the outer momentum" in _resume_refused(tmp_path)


def test_a_torn_final_line_is_repaired_from_the_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reference = _run(tmp_path / "straight", rounds=4)
    out = tmp_path / "torn"
    coordinator, transport, _ = build(small_config(rounds=4), output_dir=out)
    for _ in range(3):
        coordinator.run_round(transport)
    text = (out / "ledger.jsonl").read_text()
    (out / "ledger.jsonl").write_text(text[: len(text) - 40])  # the crash tore line 3
    report = verify_run(out)
    assert report.ok and report.repair is not None and "torn" in report.repair.reason
    with caplog.at_level(logging.WARNING, logger="lensemble.federation.ledger"):
        resumed, transport2, _ = build(small_config(rounds=4), output_dir=out, resume=True)
    assert resumed.version == 3
    # Repaired aloud, and the torn bytes are kept as they were.
    (kept,) = out.glob("ledger.jsonl.*.before-repair")
    assert kept.read_text() == text[: len(text) - 40]
    assert any(
        "torn by a crash" in r.getMessage() and kept.name in r.getMessage() for r in caplog.records
    )
    assert resumed.run(transport2).model_hash == reference
    assert verify_run(out).ok and (out / "ledger.jsonl").read_text().startswith(text)


def test_a_torn_final_line_that_disagrees_with_the_checkpoint_is_refused(
    tmp_path: Path,
) -> None:
    _run(tmp_path)
    text = (tmp_path / "ledger.jsonl").read_text()
    head, last = text[: len(text) - 40].rsplit("\n", 1)
    torn = head + "\n" + last.replace('"closed"', '"CLOSED"')
    (tmp_path / "ledger.jsonl").write_text(torn)
    assert "ledger.jsonl:3" in _resume_refused(tmp_path)


def test_signed_runs_close_what_an_unsigned_chain_cannot(tmp_path: Path) -> None:
    signer = HmacSigner(KEY)
    _run(tmp_path, signer=signer)
    assert verify_run(tmp_path, signer=signer).ok
    assert not verify_run(tmp_path, signer=HmacSigner(b"x" * 32)).ok
    # Rewriting the whole chain consistently: undetectable without the key, caught with it.
    lines = _lines(tmp_path)
    prev = ""
    for body in lines:
        body.pop("mac")
        body["record"]["mean_inner_loss"] = 0.0
        body["checkpoint"] = _rewrite_checkpoint_record(tmp_path, body["record"])
        body["prev"] = prev
        body["line_hash"] = prev = line_digest(body)
    _write_lines(tmp_path, lines)
    assert verify_run(tmp_path).ok  # the documented limit of an unsigned chain
    broken = verify_run(tmp_path, signer=signer).first_break
    assert broken is not None and broken.line == 1 and "no MAC" in broken.what
    key = tmp_path / "key"
    key.write_bytes(KEY)
    result = run_cli("verify", str(tmp_path), "--key-file", str(key))
    assert result.code == 3 and "ledger.jsonl:1" in result.out


def _rewrite_checkpoint_record(out: Path, record: dict) -> str:
    """Forge checkpoint v(round + 1) to hold ``record``, without a key; returns its state hash."""
    path = CheckpointStore(out).path(record["round"] + 1)
    decoded = decode(path.read_bytes())
    meta = {k: v for k, v in decoded.metadata.items() if not k.startswith("mac")}
    meta["record"] = canonical(record)
    params = {k: v for k, v in decoded.tensors.items() if not k.startswith(MOMENTUM_PREFIX)}
    momentum = {
        k.removeprefix(MOMENTUM_PREFIX): v
        for k, v in decoded.tensors.items()
        if k.startswith(MOMENTUM_PREFIX)
    }
    meta["state_hash"] = state_hash(
        params,
        momentum,
        version=record["round"] + 1,
        model_hash_=meta["model_hash"],
        parent_hash=meta["parent_hash"],
        config_hash=meta["config_hash"],
        record_json=meta["record"],
    )
    path.write_bytes(encode(decoded.tensors, meta))
    return meta["state_hash"]


def test_verify_refuses_a_folder_that_is_not_a_run(tmp_path: Path) -> None:
    result = run_cli("verify", str(tmp_path / "nothing"))
    assert result.code == 2 and "nothing does not exist" in result.err and not result.out
    result = run_cli("verify", str(tmp_path))
    assert result.code == 2 and "holds no ledger.jsonl" in result.err and not result.out


def test_a_version_1_ledger_is_named_not_misread(tmp_path: Path) -> None:
    _run(tmp_path)
    lines = _lines(tmp_path)
    (tmp_path / "ledger.jsonl").write_text("".join(canonical(b["record"]) + "\n" for b in lines))
    result = run_cli("verify", str(tmp_path))
    assert result.code == 2 and "version 1 ledger" in result.err
    assert Ledger  # the reader refuses the same way (see ledger.legacy_error)


class _FakeKms:
    """The two KMS calls, with HMAC-SHA256 under a key only this object holds."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def generate_mac(self, KeyId: str, Message: bytes, MacAlgorithm: str) -> dict:
        self.calls.append("GenerateMac")
        return {"Mac": bytes.fromhex(HmacSigner(KEY).mac(Message.decode()))}

    def verify_mac(self, KeyId: str, Message: bytes, MacAlgorithm: str, Mac: bytes) -> dict:
        self.calls.append("VerifyMac")
        return {"MacValid": HmacSigner(KEY).verify(Message.decode(), Mac.hex())}


def test_kms_signing_uses_generate_for_the_coordinator_and_verify_for_auditors(
    tmp_path: Path,
) -> None:
    from lensemble.federation.signing import KmsSigner

    kms = _FakeKms()
    coordinator_side = KmsSigner("arn:aws:kms:eu-central-1:1:key/run", kms)
    _run(tmp_path, signer=coordinator_side)  # type: ignore[arg-type]
    assert set(kms.calls) == {"GenerateMac"}
    assert verify_run(tmp_path, signer=coordinator_side).ok
    kms.calls.clear()
    auditor = KmsSigner("arn:aws:kms:eu-central-1:1:key/run", kms, audit=True)
    assert verify_run(tmp_path, signer=auditor).ok
    assert set(kms.calls) == {"VerifyMac"}
    lines = _lines(tmp_path)
    lines[0]["mac"]["value"] = "00" * 32
    _write_lines(tmp_path, lines)
    broken = verify_run(tmp_path, signer=auditor).first_break
    assert broken is not None and broken.line == 1


def _network_coordinator_without_io(out: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """Start the network coordinator on ``out`` resuming 5 rounds; opening servers fails."""
    from lensemble.network.launch import process
    from tests.support.federation import initial_params

    def no_io(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the coordinator opened its servers {case}")

    monkeypatch.setattr(process, "ProcessHarness", no_io)
    config = small_config(rounds=5).model_copy(
        update={"run": small_config().run.model_copy(update={"output_dir": str(out)})}
    )
    process.run_coordinator(config, initial_params(3))


def test_the_network_coordinator_verifies_before_any_network_io(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run(tmp_path)
    lines = _lines(tmp_path)
    lines[2]["record"]["model_hash"] = "sha256:" + "1" * 64
    _write_lines(tmp_path, lines)
    with pytest.raises(IntegrityError, match="ledger.jsonl:3"):
        _network_coordinator_without_io(tmp_path, monkeypatch, "on a broken run record")


def test_verify_checks_checkpoints_without_importing_torch(tmp_path: Path) -> None:
    """``lensemble verify`` must start fast: its checkpoint digests are numpy's, equal to torch's."""
    import subprocess
    import sys

    _run(tmp_path)
    script = (
        "import sys; from pathlib import Path; from lensemble.federation.verify import verify_run;"
        "r = verify_run(Path(sys.argv[1])); print(r.ok, r.checkpoints, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["True", "[1,", "2,", "3]", "False"]


# ------------------------------------------------------------------------ keys on resume
_KEY_VARIABLES = (
    "LENSEMBLE_LEDGER_KEY_FILE",
    "LENSEMBLE_LEDGER_KEY",
    "LENSEMBLE_LEDGER_KMS_KEY_ID",
)


@pytest.fixture
def no_key(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in _KEY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _snapshot(out: Path) -> dict[str, bytes]:
    """Every file of the run folder but the (empty) lock files a command may create."""
    files = (p for p in sorted(out.rglob("*")) if p.is_file() and "lock" not in p.name)
    return {str(p.relative_to(out)): p.read_bytes() for p in files}


def test_a_signed_run_does_not_resume_without_its_key(
    tmp_path: Path, no_key: pytest.MonkeyPatch
) -> None:
    signer = HmacSigner(KEY)
    _run(tmp_path, signer=signer)
    before = _snapshot(tmp_path)
    with pytest.raises(UsageError) as caught:
        build(small_config(rounds=5), output_dir=tmp_path, resume=True)
    message = str(caught.value)
    assert caught.value.exit_code == 2
    assert f"{tmp_path / 'ledger.jsonl'} is signed (hmac-sha256, key {signer.key_id})" in message
    assert "LENSEMBLE_LEDGER_KEY_FILE" in message and "\n" not in message
    assert _snapshot(tmp_path) == before  # nothing trained, nothing appended unsigned
    # With the key, the same resume continues and every line verifies with it.
    no_key.setenv("LENSEMBLE_LEDGER_KEY", KEY.hex())
    coordinator, transport, _ = build(small_config(rounds=5), output_dir=tmp_path, resume=True)
    coordinator.run(transport)
    report = verify_run(tmp_path, signer=signer)
    assert report.ok and report.signed == report.lines == 5


def test_simulate_resume_of_a_signed_run_without_its_key_exits_2_at_once(
    tmp_path: Path, no_key: pytest.MonkeyPatch
) -> None:
    _run(tmp_path, signer=HmacSigner(KEY))
    before = _snapshot(tmp_path)
    result = run_cli("simulate", "-r", "6", "-o", str(tmp_path), "--resume")
    assert result.code == 2, result.err
    assert "is signed" in result.err and "LENSEMBLE_LEDGER_KEY_FILE" in result.err
    assert "Traceback" not in result.err and "collecting data" not in result.err
    assert _snapshot(tmp_path) == before


def test_the_network_coordinator_needs_the_key_of_a_signed_run_before_any_io(
    tmp_path: Path, no_key: pytest.MonkeyPatch
) -> None:
    _run(tmp_path, signer=HmacSigner(KEY))
    with pytest.raises(UsageError, match="is signed .* LENSEMBLE_LEDGER_KEY_FILE"):
        _network_coordinator_without_io(tmp_path, no_key, "without the run's key")


def test_a_signed_kms_run_names_the_kms_key_to_set(
    tmp_path: Path, no_key: pytest.MonkeyPatch
) -> None:
    from lensemble.federation.signing import KmsSigner

    arn = "arn:aws:kms:eu-central-1:1:key/run"
    _run(tmp_path, signer=KmsSigner(arn, _FakeKms()))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=f"set LENSEMBLE_LEDGER_KMS_KEY_ID={arn}"):
        require_matching_key(tmp_path, "ledger.jsonl", None)


def test_a_signed_first_checkpoint_alone_needs_the_key(tmp_path: Path) -> None:
    from lensemble.federation.coordinator import Coordinator
    from tests.support.federation import initial_params

    # A coordinator that stopped before its first round left only its signed checkpoint v0.
    Coordinator(small_config(), initial_params(3), output_dir=tmp_path, signer=HmacSigner(KEY))
    assert not (tmp_path / "ledger.jsonl").exists()
    with pytest.raises(UsageError, match="model-v000000.safetensors is signed"):
        require_matching_key(tmp_path, "ledger.jsonl", None)
    require_matching_key(tmp_path, "ledger.jsonl", HmacSigner(KEY))  # the key fits


def test_a_key_for_an_unsigned_run_is_refused_as_unverifiable(
    tmp_path: Path, no_key: pytest.MonkeyPatch
) -> None:
    _run(tmp_path)
    before = _snapshot(tmp_path)
    no_key.setenv("LENSEMBLE_LEDGER_KEY", KEY.hex())
    with pytest.raises(IntegrityError) as caught:
        build(small_config(rounds=5), output_dir=tmp_path, resume=True)
    message = str(caught.value)
    assert caught.value.exit_code == 3
    assert "carries no MAC, but a signing key is configured" in message
    assert "never signed or its MACs were removed" in message
    assert _snapshot(tmp_path) == before
    require_matching_key(tmp_path / "empty", "ledger.jsonl", HmacSigner(KEY))  # a new run: fine


def test_verify_without_the_key_says_the_macs_were_not_checked(
    tmp_path: Path, no_key: pytest.MonkeyPatch
) -> None:
    _run(tmp_path, signer=HmacSigner(KEY))
    result = run_cli("verify", str(tmp_path))
    assert result.code == 0 and "3 MACs present but not checked (no key)" in result.out
    report = json.loads(run_cli("verify", str(tmp_path), "--json").out)
    assert report["macs_checked"] is False and report["signed"] == 3


def test_verify_without_the_key_notes_that_the_signature_was_not_checked(
    tmp_path: Path, no_key: pytest.MonkeyPatch
) -> None:
    # Issue 41, item 9: a signed run verified without a key exited 0 with nothing on stderr.
    _run(tmp_path, signer=HmacSigner(KEY))
    result = run_cli("verify", str(tmp_path))
    assert result.code == 0
    assert "signature was NOT checked" in result.err and "--key-file" in result.err
    required = run_cli("verify", str(tmp_path), "--require-signature")
    assert required.code == 3
    assert "is signed, but no key was given" in required.err
    key_file = tmp_path.parent / "key"
    key_file.write_bytes(KEY)
    checked = run_cli("verify", str(tmp_path), "--key-file", str(key_file), "--require-signature")
    assert checked.code == 0, checked.err
    assert "3 MACs checked" in checked.out and "NOT checked" not in checked.err


def test_require_signature_refuses_an_unsigned_run(
    tmp_path: Path, no_key: pytest.MonkeyPatch
) -> None:
    _run(tmp_path)
    assert run_cli("verify", str(tmp_path)).code == 0
    required = run_cli("verify", str(tmp_path), "--require-signature")
    assert required.code == 3 and "is not signed" in required.err


@pytest.mark.parametrize("rounds", [2, 3], ids=["checkpoint-v0-first", "ledger-line-first"])
def test_verify_with_a_wrong_key_names_both_fingerprints(
    tmp_path: Path, no_key: pytest.MonkeyPatch, rounds: int
) -> None:
    # Issue 41, item 9: checkpoint v0 (kept while a run has at most 3 checkpoints) is the
    # first link, and its break named only the key supplied, as if it were the run's.
    _run(tmp_path, rounds=rounds, signer=HmacSigner(KEY))
    wrong = tmp_path.parent / "wrong-key"
    wrong.write_bytes(b"w" * 32)
    result = run_cli("verify", str(tmp_path), "--key-file", str(wrong))
    assert result.code == 3
    signed_with, given = HmacSigner(KEY).key_id, HmacSigner(b"w" * 32).key_id
    first = "model-v000000.safetensors:" if rounds == 2 else "ledger.jsonl:1:"
    assert first in result.out
    assert f"is signed with key {signed_with}" in result.out
    assert f"not with the key given (hmac-sha256, key {given})" in result.out


# ------------------------------------------------------------------ what verify names
def test_a_renamed_checkpoint_is_named_as_renamed_not_as_two_equal_hashes(tmp_path: Path) -> None:
    _run(tmp_path)
    store = CheckpointStore(tmp_path)
    store.path(2).replace(store.path(3))  # mv model-v000002... model-v000003...
    result = run_cli("verify", str(tmp_path))
    assert result.code == 3
    assert result.out == (
        f"BROKEN {store.path(3)}: is named version 3, but its contents record version 2 (the "
        "file was renamed or copied over another version's name)\n"
    )
    with pytest.raises(IntegrityError) as caught:
        store.load(3)
    assert "named version 3, but its contents record version 2" in caught.value.message
    assert "model-v000002.safetensors" in caught.value.remediation
    assert "model-v000003" in _resume_refused(tmp_path)


def _flip_momentum(out: Path, version: int) -> None:
    path = CheckpointStore(out).path(version)
    decoded = decode(path.read_bytes())
    tensors = dict(decoded.tensors)
    name = sorted(k for k in tensors if k.startswith(MOMENTUM_PREFIX))[0]
    tensors[name] = tensors[name] + 1.0
    path.write_bytes(encode(tensors, dict(decoded.metadata)))


@pytest.mark.parametrize(
    ("edited_line", "first"),
    [(5, "model-v000003.safetensors:"), (3, "ledger.jsonl:3:"), (2, "ledger.jsonl:2:")],
)
def test_of_two_breaks_the_earliest_in_chain_order_is_named(
    tmp_path: Path, edited_line: int, first: str
) -> None:
    _run(tmp_path, rounds=5)  # checkpoints v3, v4, v5 are kept
    lines = _lines(tmp_path)
    lines[edited_line - 1]["record"]["mean_inner_loss"] = 0.25  # line hash left as it was
    _write_lines(tmp_path, lines)
    _flip_momentum(tmp_path, 3)  # checkpoint v3, which line 3 commits
    report = verify_run(tmp_path)
    assert report.first_break is not None
    assert report.first_break.sentence().split(" ", 1)[0].endswith(first)
    assert first in _resume_refused(tmp_path, rounds=7)
    result = json.loads(run_cli("verify", str(tmp_path), "--json").out)
    assert result["status"] == "broken" and result["first_break"]["message"].split()[0].endswith(
        first
    )


# ----------------------------------------------------------------- verify --json, bad input
@pytest.mark.parametrize("case", ["missing folder", "not a run folder", "short key", "version 1"])
def test_verify_json_reports_bad_input_as_json_and_exits_2(tmp_path: Path, case: str) -> None:
    run = tmp_path / "run"
    args: list[str] = []
    if case == "missing folder":
        run = tmp_path / "nothing"
    elif case == "not a run folder":
        run.mkdir()
    else:
        _run(run)
    if case == "short key":
        (tmp_path / "key").write_bytes(b"short")
        args = ["--key-file", str(tmp_path / "key")]
    if case == "version 1":
        lines = _lines(run)
        (run / "ledger.jsonl").write_text("".join(canonical(b["record"]) + "\n" for b in lines))
    result = run_cli("verify", str(run), "--json", *args)
    assert result.code == 2
    out = json.loads(result.out)  # one JSON object, nothing else on stdout
    assert out["status"] == "bad_input" and out["ok"] is False and out["exit_code"] == 2
    assert out["error"] and "\n" not in out["error"] and out["run_dir"] == str(run)
    assert result.err == f"error: {out['error']}\n"  # the same sentence for people


# ------------------------------------------------------------------ what a second audit found
def test_verify_never_prints_the_mac_a_forged_line_would_need(tmp_path: Path) -> None:
    signer = HmacSigner(KEY)
    _run(tmp_path, signer=signer)
    lines = _lines(tmp_path)
    lines[0]["mac"]["value"] = "00" * 32  # a wrong MAC on an otherwise valid line
    _write_lines(tmp_path, lines)
    wanted = signer.mac(lines[0]["line_hash"])  # what would sign it
    key = tmp_path / "key"
    key.write_bytes(KEY)
    for args in ((), ("--json",)):
        result = run_cli("verify", str(tmp_path), "--key-file", str(key), *args)
        assert result.code == 3 and "does not verify" in result.out
        assert wanted not in result.out + result.err
    from lensemble.federation.coordinator import Coordinator
    from tests.support.federation import initial_params

    with pytest.raises(IntegrityError) as caught:
        Coordinator(
            small_config(rounds=5),
            initial_params(3),
            output_dir=tmp_path,
            resume=True,
            signer=signer,
        )
    assert wanted not in caught.value.message + (caught.value.remediation or "")


def test_a_key_file_is_used_byte_for_byte(tmp_path: Path) -> None:
    from lensemble.federation.signing import read_key_file

    raw = b"\r" + b"k" * 30 + b"\n"  # 32 bytes that begin and end with whitespace
    key = tmp_path / "key"
    key.write_bytes(raw)
    assert read_key_file(key).mac("sha256:" + "0" * 64) == HmacSigner(raw).mac("sha256:" + "0" * 64)


def test_ledger_macs_stripped_beside_signed_checkpoints_break_without_a_key(
    tmp_path: Path, no_key: pytest.MonkeyPatch
) -> None:
    _run(tmp_path, signer=HmacSigner(KEY))
    lines = _lines(tmp_path)
    prev = ""
    for body in lines:  # the MACs removed and the chain re-hashed; checkpoints left as signed
        body.pop("mac")
        body["prev"] = prev
        body["line_hash"] = prev = line_digest(body)
    _write_lines(tmp_path, lines)
    broken = verify_run(tmp_path).first_break
    assert broken is not None and broken.line == 1 and "MACs were removed" in broken.what
    assert run_cli("verify", str(tmp_path)).code == 3


def test_a_checkpoint_renamed_past_the_rounds_is_named_not_the_rounds(tmp_path: Path) -> None:
    _run(tmp_path, rounds=3)
    store = CheckpointStore(tmp_path)
    store.path(2).replace(store.path(9))
    from lensemble.simulation.output import prepare_output_dir

    config = small_config(rounds=5).model_copy(
        update={"run": small_config(rounds=5).run.model_copy(update={"output_dir": str(tmp_path)})}
    )
    with pytest.raises(IntegrityError) as caught:
        prepare_output_dir(config, resume=True)
    assert "is named version 9, but its contents record version 2" in caught.value.message


def test_a_checkpoint_hash_break_gives_both_hashes_as_fields_and_its_line(tmp_path: Path) -> None:
    _run(tmp_path, rounds=3)
    _flip_momentum(tmp_path, 3)
    result = run_cli("verify", str(tmp_path), "--json")
    assert result.code == 3
    brk = json.loads(result.out)["first_break"]
    assert HASH.fullmatch(brk["expected"]) and HASH.fullmatch(brk["found"])
    assert brk["expected"] != brk["found"]
    assert "recorded state hash" in brk["what"] and "ledger line 3" in brk["what"]


# ------------------------------------------------------------------------ the config a resume uses
def _forge_config_view(out: Path, version: int, config: object) -> None:
    """Rewrite checkpoint ``version``'s recorded config view to ``config``'s, keeping its MAC."""
    from lensemble.config.hashing import canonical_json, hashed_view

    path = CheckpointStore(out).path(version)
    decoded = decode(path.read_bytes())
    meta = dict(decoded.metadata)
    meta["config_view"] = canonical_json(hashed_view(config)).decode()  # type: ignore[arg-type]
    path.write_bytes(encode(decoded.tensors, meta))


def test_a_signed_run_never_resumes_under_an_edited_config_view(
    tmp_path: Path, no_key: pytest.MonkeyPatch
) -> None:
    signer = HmacSigner(KEY)
    _run(tmp_path, signer=signer)
    no_key.setenv("LENSEMBLE_LEDGER_KEY", KEY.hex())
    # The config an attacker wants the resume to run: it differs from the signed one in more
    # than federation.rounds, and the checkpoint's view is edited to match it.
    edited = small_config(rounds=5, inner_steps=5, quorum=2)
    _forge_config_view(tmp_path, 3, edited)
    checkpoint = str(CheckpointStore(tmp_path).path(3))
    report = verify_run(tmp_path, signer=signer)
    assert report.first_break is not None and report.first_break.file == checkpoint
    assert "config" in report.first_break.what
    key = tmp_path.parent / "key"
    key.write_bytes(KEY)
    result = run_cli("verify", str(tmp_path), "--key-file", str(key))
    assert result.code == 3 and checkpoint in result.out
    message = _resume_refused_with(tmp_path, edited)
    assert checkpoint in message and "config" in message


def _resume_refused_with(out: Path, config: object) -> str:
    """Resume under ``config`` must refuse before any training or write; returns the error."""
    before = _snapshot(out)
    with pytest.raises(IntegrityError) as caught:
        build(config, output_dir=out, resume=True)  # type: ignore[arg-type]
    assert caught.value.exit_code == 3
    assert _snapshot(out) == before
    return caught.value.message


def test_an_unsigned_run_never_resumes_under_an_edited_config_view(tmp_path: Path) -> None:
    from lensemble.config.hashing import HASH_ALGORITHM
    from lensemble.federation.checkpoint_audit import CONFIG_HASH_ALGORITHM

    assert CONFIG_HASH_ALGORITHM == HASH_ALGORITHM
    _run(tmp_path)
    edited = small_config(rounds=5, inner_steps=5)
    _forge_config_view(tmp_path, 3, edited)
    checkpoint = str(CheckpointStore(tmp_path).path(3))
    assert checkpoint in _resume_refused_with(tmp_path, edited)
    # The honest config still resumes once the view is the one the state hash vouches for.
    _forge_config_view(tmp_path, 3, small_config(rounds=3))
    coordinator, transport, _ = build(small_config(rounds=5), output_dir=tmp_path, resume=True)
    coordinator.run(transport)
    assert verify_run(tmp_path).ok


# ------------------------------------------------------------------------ malformed values
def _rechain(out: Path, lines: list[dict]) -> None:
    """Write ``lines`` with every link and line hash recomputed (an unsigned forger's edit)."""
    prev = ""
    for body in lines:
        body["prev"] = prev
        body["line_hash"] = prev = line_digest(body)
    _write_lines(out, lines)


@pytest.mark.parametrize(
    ("field", "value"),
    [("round", None), ("round", "2"), ("attempt", {"nested": [["junk"]]}), ("excluded", [1])],
)
def test_a_malformed_ledger_value_is_named_with_its_line_never_a_traceback(
    tmp_path: Path, field: str, value: object
) -> None:
    _run(tmp_path, rounds=5)  # checkpoints v3-v5 kept: only the ledger speaks for line 2
    lines = _lines(tmp_path)
    lines[1]["record"][field] = value
    _rechain(tmp_path, lines)
    result = run_cli("verify", str(tmp_path))
    assert result.code == 3, result.err
    assert "ledger.jsonl:2" in result.out and field in result.out
    assert "Traceback" not in result.err + result.out
    message = _resume_refused(tmp_path, rounds=6)
    assert "ledger.jsonl:2" in message and field in message


def test_a_checkpoint_record_that_is_not_a_record_is_no_repair(tmp_path: Path) -> None:
    _run(tmp_path)
    lines = _lines(tmp_path)
    record = lines[2]["record"]
    _write_lines(tmp_path, lines[:2])  # line 3 lost in a crash: checkpoint v3 would restore it
    forged = _rewrite_checkpoint_text(tmp_path, 3, json.dumps([record]))
    assert forged
    result = run_cli("verify", str(tmp_path))
    assert result.code == 3 and "Traceback" not in result.err + result.out
    assert "model-v000003" in result.out
    _resume_refused(tmp_path)


def _rewrite_checkpoint_text(out: Path, version: int, record_text: str) -> str:
    """Forge checkpoint ``version`` to hold ``record_text`` as its record; its state hash."""
    path = CheckpointStore(out).path(version)
    decoded = decode(path.read_bytes())
    meta = {k: v for k, v in decoded.metadata.items() if not k.startswith("mac")}
    meta["record"] = record_text
    params = {k: v for k, v in decoded.tensors.items() if not k.startswith(MOMENTUM_PREFIX)}
    momentum = {
        k.removeprefix(MOMENTUM_PREFIX): v
        for k, v in decoded.tensors.items()
        if k.startswith(MOMENTUM_PREFIX)
    }
    meta["state_hash"] = state_hash(
        params,
        momentum,
        version=version,
        model_hash_=meta["model_hash"],
        parent_hash=meta["parent_hash"],
        config_hash=meta["config_hash"],
        record_json=record_text,
    )
    path.write_bytes(encode(decoded.tensors, meta))
    return meta["state_hash"]


def test_a_control_character_in_a_ledger_value_is_printed_escaped(tmp_path: Path) -> None:
    _run(tmp_path)
    lines = _lines(tmp_path)
    lines[1]["ledger"] = "v2\x1b[2J\ud800"  # a terminal escape and a lone surrogate
    _write_lines(tmp_path, lines)
    result = run_cli("verify", str(tmp_path))
    assert result.code == 3 and "Traceback" not in result.err + result.out
    assert "ledger.jsonl:2" in result.out and "\x1b" not in result.out
