"""A network participant's secret seed of its differential-privacy randomness (issue 38).

DP-SGD's record sampling and Gaussian noise come from one seed per participant. In the
in-process simulation it derives from the run seed, which every party knows; over the network
it derives from the participant's own TLS private key instead, with HKDF-SHA256 under a salt of
its own (:func:`lensemble.network.participant.peer_keys.secret_seed`). Only the key's holder can
compute it, so nobody else, the coordinator included, can regenerate the noise and remove it;
a rerun or a restarted participant draws the same bits, and stores no secret of its own.
"""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization

from lensemble.config import LensembleConfig
from lensemble.errors import ConfigError
from lensemble.network.participant.peer_keys import secret_seed
from lensemble.network.shared.security import load_tls

#: HKDF salt of the noise seed: a masking seed and a noise seed of one key never coincide.
NOISE_SALT = b"lensemble-dp-noise-v1"


def noise_seed(config: LensembleConfig, participant: str) -> int:
    """The participant's secret DP-SGD seed (a non-negative 63-bit integer).

    Raises:
        ConfigError: TLS is off (no private key to derive it from) or the key file is
            unreadable, naming the field and the fix.
    """
    files = load_tls(config, participant)
    if files is None:
        raise ConfigError(
            "network.tls.enabled: a participant's differential-privacy noise is seeded from its "
            "own TLS key over the network; set network.tls.enabled: true."
        )
    try:
        key = serialization.load_pem_private_key(files.key, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"network.tls.key_file: the key of participant '{participant}' is unreadable "
            f"({exc}); point it at the participant's PEM private key."
        ) from None
    seed = secret_seed(key, config, salt=NOISE_SALT)  # type: ignore[arg-type]
    return int.from_bytes(seed[:8], "little") >> 1
