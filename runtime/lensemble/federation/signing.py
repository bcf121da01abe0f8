"""Optional MACs over the run record: HMAC-SHA256 with a local key, or an AWS KMS MAC key.

Without a key the hash chain shows any edit that was not carried through every later line and
checkpoint, but someone with write access to the run folder can rewrite the whole chain
consistently. A MAC closes that: only a holder of the key can produce a line that verifies.

Key sources, first match wins (:func:`signer_from_env`):

- ``LENSEMBLE_LEDGER_KEY_FILE``: a file holding the key (raw bytes, at least 32 bytes);
- ``LENSEMBLE_LEDGER_KEY``: the key itself as hex (at least 64 hex digits);
- ``LENSEMBLE_LEDGER_KMS_KEY_ID``: an AWS KMS HMAC_256 key (ARN or alias): the coordinator needs
  ``kms:GenerateMac`` on it, an auditor ``kms:VerifyMac`` (the Pulumi program creates it per run).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from lensemble.errors import LensembleError, ToolMissing, UsageError

KEY_FILE_ENV = "LENSEMBLE_LEDGER_KEY_FILE"
KEY_ENV = "LENSEMBLE_LEDGER_KEY"
KMS_KEY_ENV = "LENSEMBLE_LEDGER_KMS_KEY_ID"
MIN_KEY_BYTES = 32


class Signer(Protocol):
    """Produces and checks MACs over hash strings (``sha256:<hex>``).

    Attributes:
        algorithm: ``hmac-sha256`` or ``kms-hmac-sha256``.
        key_id: Names the key without revealing it.
    """

    algorithm: str
    key_id: str

    def mac(self, message: str) -> str:
        """Hex MAC of ``message``."""
        ...

    def verify(self, message: str, mac_hex: str) -> bool:
        """Whether ``mac_hex`` is this key's MAC of ``message``."""
        ...


class HmacSigner:
    """HMAC-SHA256 with a local secret key (local and staging runs).

    Args:
        key: The secret, at least :data:`MIN_KEY_BYTES` bytes.

    Attributes:
        key_id: First 16 hex digits of a domain-separated hash of the key.
    """

    algorithm = "hmac-sha256"

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.key_id = hashlib.sha256(b"lensemble/ledger-key-id\x00" + key).hexdigest()[:16]

    def mac(self, message: str) -> str:
        """Hex HMAC-SHA256 of ``message``."""
        return hmac.new(self.key, message.encode(), hashlib.sha256).hexdigest()

    def verify(self, message: str, mac_hex: str) -> bool:
        """Constant-time comparison with the expected MAC (any text: False, never an error)."""
        return _same_mac(self.mac(message), mac_hex)


class KmsSigner:
    """HMAC-SHA256 computed by an AWS KMS ``HMAC_256`` key (sovereign-prod).

    Args:
        key_id: The key's ARN or alias.
        client: A ``boto3`` KMS client (built from the environment when omitted).
        audit: Verify with ``kms:VerifyMac`` (the auditor role); otherwise verify by computing
            the MAC again with ``kms:GenerateMac`` (the coordinator role, which may not call
            VerifyMac; KMS HMAC is deterministic).

    Raises:
        ToolMissing: ``boto3`` is not installed and no client was given.
    """

    algorithm = "kms-hmac-sha256"

    def __init__(self, key_id: str, client: Any = None, *, audit: bool = False) -> None:
        self.key_id = key_id
        self.audit = audit
        if client is None:
            try:
                import boto3
            except ImportError:
                raise ToolMissing(
                    f"{KMS_KEY_ENV} is set but boto3 is not installed;",
                    remediation="pip install boto3 in the coordinator's image, or sign with "
                    f"{KEY_FILE_ENV} instead.",
                ) from None
            client = boto3.client("kms")
        self._client = client

    def mac(self, message: str) -> str:
        """KMS ``GenerateMac`` of ``message``, hex.

        Raises:
            ToolMissing: KMS refused or could not be reached (the error names the key and the
                permission to check).
        """
        try:
            out = self._client.generate_mac(
                KeyId=self.key_id, Message=message.encode(), MacAlgorithm="HMAC_SHA_256"
            )
        except Exception as exc:
            raise self._kms_failed("GenerateMac", exc) from None
        return bytes(out["Mac"]).hex()

    def _kms_failed(self, operation: str, exc: Exception) -> LensembleError:
        """A person-readable error for a failed KMS call; our own bugs stay tracebacks."""
        if not type(exc).__module__.startswith("botocore"):
            raise exc
        code = getattr(exc, "response", {}).get("Error", {}).get("Code") or type(exc).__name__
        return ToolMissing(
            f"AWS KMS {operation} on the run-record key {self.key_id} failed ({code});",
            remediation=f"check that this role may call kms:{operation} on that key and that "
            "the network reaches KMS (a kms VPC endpoint in a private cluster).",
        )

    def verify(self, message: str, mac_hex: str) -> bool:
        """KMS ``VerifyMac`` (auditors) or a fresh ``GenerateMac`` compared; False if wrong."""
        if not self.audit:
            return _same_mac(self.mac(message), mac_hex)
        try:
            out = self._client.verify_mac(
                KeyId=self.key_id,
                Message=message.encode(),
                MacAlgorithm="HMAC_SHA_256",
                Mac=bytes.fromhex(mac_hex),
            )
        except ValueError:
            return False
        except Exception as exc:
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
            if "KMSInvalidMacException" in (type(exc).__name__, code):  # a wrong MAC
                return False
            raise self._kms_failed("VerifyMac", exc) from None
        return bool(out.get("MacValid"))


def read_key_file(path: Path) -> HmacSigner:
    """An :class:`HmacSigner` from a key file: its bytes exactly, whitespace and newline included.

    Raises:
        UsageError: The file is missing, unreadable or shorter than 32 bytes.
    """
    try:
        # The file's bytes exactly: random bytes may begin or end with whitespace.
        key = path.read_bytes()
    except OSError as exc:
        raise UsageError(
            f"cannot read the ledger key file {path} ({exc.strerror});",
            remediation=f"point {KEY_FILE_ENV} or --key-file at a readable file.",
        ) from None
    if len(key) < MIN_KEY_BYTES:
        raise UsageError(
            f"the ledger key in {path} is {len(key)} bytes, fewer than {MIN_KEY_BYTES};",
            remediation="write at least 32 random bytes, e.g. `head -c 32 /dev/urandom > KEY`.",
        )
    return HmacSigner(key)


def signer_from_env(
    environ: Mapping[str, str] | None = None, key_file: Path | None = None, *, audit: bool = False
) -> Signer | None:
    """The signer the environment (or ``--key-file``) asks for, or None for an unsigned run.

    Raises:
        UsageError: The key is missing, malformed or too short.
        ToolMissing: A KMS key is named but boto3 is missing.
    """
    env = os.environ if environ is None else environ
    if key_file is not None:
        return read_key_file(key_file)
    if env.get(KEY_FILE_ENV):
        return read_key_file(Path(env[KEY_FILE_ENV]))
    if env.get(KEY_ENV):
        try:
            key = bytes.fromhex(env[KEY_ENV].strip())
        except ValueError:
            raise UsageError(
                f"{KEY_ENV} is not hexadecimal;",
                remediation="set it to at least 64 hex digits (32 bytes), or use a key file.",
            ) from None
        if len(key) < MIN_KEY_BYTES:
            raise UsageError(
                f"{KEY_ENV} holds {len(key)} bytes, fewer than {MIN_KEY_BYTES};",
                remediation="set it to at least 64 hex digits (32 bytes).",
            )
        return HmacSigner(key)
    if env.get(KMS_KEY_ENV):
        return KmsSigner(env[KMS_KEY_ENV], audit=audit)
    return None


def _same_mac(expected: str, found: str) -> bool:
    """Constant-time ``expected == found`` for any text.

    A MAC read from a record may be any text, and ``hmac.compare_digest`` raises on non-ASCII
    strings, so both are compared as UTF-8 bytes.
    """
    return hmac.compare_digest(expected.encode(), found.encode("utf-8", "surrogatepass"))
