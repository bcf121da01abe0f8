"""Secret seeds a process derives from its own TLS private key, one per use (its salt).

A participant's masking seed, its DP-SGD noise seed and the coordinator's central-DP noise seed
must be secret (nobody else, the coordinator included, may regenerate them) and yet the same on
a rerun or after a restart, so that nothing secret needs storing. Each is HKDF-SHA256
(RFC 5869) of the process's private key (its PKCS#8 DER bytes), salted by its use and bound to
the run (its name and config hash as ``info``).
"""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from lensemble.config import LensembleConfig, config_hash
from lensemble.errors import ConfigError
from lensemble.network.shared.security import load_tls


def key_secret(key: Any, config: LensembleConfig, salt: bytes) -> bytes:
    """32 secret bytes: HKDF-SHA256 of ``key``'s PKCS#8 DER under ``salt``, bound to the run.

    Args:
        key: A private key of ``cryptography`` (any type that serialises to PKCS#8).
        config: The run's config (its name and hash are the ``info``).
        salt: The use's salt, so two uses of one key never share bits.
    """
    material = key.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    run = f"{config.run.name}:{config_hash(config)}".encode()
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=run).derive(material)


def tls_key_seed(
    config: LensembleConfig, identity: str, salt: bytes, *, needs_tls: str, whose: str
) -> int:
    """A non-negative 63-bit seed from ``identity``'s own TLS key under ``salt``.

    Args:
        config: The run's config (``network.tls``).
        identity: Whose key files (``coordinator`` or a participant id).
        salt: The use's salt.
        needs_tls: The sentence that says what needs TLS and the fix, when TLS is off.
        whose: Whose key, for the error when it is unreadable (e.g. "participant 'alpha'").

    Raises:
        ConfigError: TLS is off, or the key file is unreadable, naming the field and the fix.
    """
    files = load_tls(config, identity)
    if files is None:
        raise ConfigError(f"network.tls.enabled: {needs_tls}")
    try:
        key = serialization.load_pem_private_key(files.key, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"network.tls.key_file: the key of {whose} is unreadable ({exc}); point it at "
            f"the PEM private key of {whose}."
        ) from None
    return int.from_bytes(key_secret(key, config, salt)[:8], "little") >> 1
