"""A network participant's secret seed of its differential-privacy randomness (issue 38).

DP-SGD's record sampling and Gaussian noise come from one seed per participant. In the
in-process simulation it derives from the run seed, which every party knows; over the network
it derives from the participant's own TLS private key instead, with HKDF-SHA256 under a salt of
its own (:mod:`lensemble.network.shared.key_seeds`). Only the key's holder can
compute it, so nobody else, the coordinator included, can regenerate the noise and remove it;
a rerun or a restarted participant draws the same bits, and stores no secret of its own.
"""

from __future__ import annotations

from lensemble.config import LensembleConfig
from lensemble.network.shared.key_seeds import tls_key_seed

#: HKDF salt of the noise seed: a masking seed and a noise seed of one key never coincide.
NOISE_SALT = b"lensemble-dp-noise-v1"


def noise_seed(config: LensembleConfig, participant: str) -> int:
    """The participant's secret DP-SGD seed (a non-negative 63-bit integer).

    Raises:
        ConfigError: TLS is off (no private key to derive it from) or the key file is
            unreadable, naming the field and the fix.
    """
    return tls_key_seed(
        config,
        participant,
        NOISE_SALT,
        needs_tls="a participant's differential-privacy noise is seeded from its own TLS key "
        "over the network; set network.tls.enabled: true.",
        whose=f"participant '{participant}'",
    )
