"""KMS signing against the real boto3 client (botocore's Stubber: exact requests, no network)."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from lensemble.errors import ToolMissing
from lensemble.federation.signing import KmsSigner, signer_from_env

boto3 = pytest.importorskip("boto3", reason="boto3 (the [kms] extra) is not installed")
from botocore.stub import Stubber  # noqa: E402

KEY_ID = "arn:aws:kms:eu-central-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
MESSAGE = "sha256:" + "ab" * 32
SECRET = b"s" * 32


def _client():  # type: ignore[no-untyped-def]
    return boto3.client(
        "kms",
        region_name="eu-central-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )


def _mac() -> bytes:
    return hmac.new(SECRET, MESSAGE.encode(), hashlib.sha256).digest()


def test_the_coordinator_signs_with_generate_mac_on_the_named_key() -> None:
    client = _client()
    with Stubber(client) as stub:
        request = {"KeyId": KEY_ID, "Message": MESSAGE.encode(), "MacAlgorithm": "HMAC_SHA_256"}
        response = {"Mac": _mac(), "MacAlgorithm": "HMAC_SHA_256", "KeyId": KEY_ID}
        stub.add_response("generate_mac", response, request)
        stub.add_response("generate_mac", response, request)
        signer = KmsSigner(KEY_ID, client)
        assert signer.mac(MESSAGE) == _mac().hex()
        # Without audit rights it checks by generating again (HMAC is deterministic).
        assert signer.verify(MESSAGE, _mac().hex())
        stub.assert_no_pending_responses()


def test_an_auditor_verifies_with_verify_mac_and_a_wrong_mac_is_false() -> None:
    client = _client()
    with Stubber(client) as stub:
        stub.add_response("verify_mac", {"MacValid": True, "KeyId": KEY_ID})
        stub.add_client_error(
            "verify_mac", service_error_code="KMSInvalidMacException", http_status_code=400
        )
        auditor = KmsSigner(KEY_ID, client, audit=True)
        assert auditor.verify(MESSAGE, _mac().hex())
        assert not auditor.verify(MESSAGE, "00" * 32)


@pytest.mark.parametrize("code", ["AccessDeniedException", "NotFoundException"])
def test_a_refused_kms_call_names_the_key_and_the_permission(code: str) -> None:
    client = _client()
    with Stubber(client) as stub:
        stub.add_client_error("generate_mac", service_error_code=code, http_status_code=400)
        with pytest.raises(ToolMissing) as err:
            KmsSigner(KEY_ID, client).mac(MESSAGE)
    text = str(err.value)
    assert KEY_ID in text and code in text and "kms:GenerateMac" in text


def test_the_environment_variable_builds_a_kms_signer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-central-1")
    signer = signer_from_env({"LENSEMBLE_LEDGER_KMS_KEY_ID": KEY_ID})
    assert isinstance(signer, KmsSigner) and signer.key_id == KEY_ID
