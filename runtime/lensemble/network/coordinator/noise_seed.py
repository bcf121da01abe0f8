"""The network coordinator's secret seed of its central differential-privacy noise (issue 38).

Under ``federation.central_privacy`` with plain aggregation the coordinator adds the Gaussian
noise to the round's mean (:mod:`lensemble.federation.central_privacy`). In the in-process
simulation the seed derives from the run seed; over the network it derives from the
coordinator's own TLS private key with HKDF-SHA256 under a salt of its own (as a participant's
DP-SGD seed does, :mod:`lensemble.network.shared.key_seeds`), with the run's name and
config hash as info: only the key's holder can compute it, so nobody else can regenerate the
noise and remove it, and a rerun or a restarted coordinator draws the same bits.
"""

from __future__ import annotations

from lensemble.config import LensembleConfig
from lensemble.network.shared.identity import COORDINATOR_IDENTITY
from lensemble.network.shared.key_seeds import tls_key_seed

#: HKDF salt of the coordinator's central noise seed.
CENTRAL_NOISE_SALT = b"lensemble-central-dp-noise-v1"


def central_noise_seed(config: LensembleConfig) -> int:
    """The coordinator's secret central-noise seed (a non-negative 63-bit integer).

    Raises:
        ConfigError: TLS is off (no private key to derive it from) or the key file is
            unreadable, naming the field and the fix.
    """
    return tls_key_seed(
        config,
        COORDINATOR_IDENTITY,
        CENTRAL_NOISE_SALT,
        needs_tls="the coordinator seeds its central differential-privacy noise from its own "
        "TLS key over the network; set network.tls.enabled: true (or "
        "federation.central_privacy: null).",
        whose="the coordinator",
    )


def coordinator_noise_seed(config: LensembleConfig) -> int | None:
    """The coordinator's own seed when it adds central noise (plain aggregation), else None.

    Under masking the participants add the noise, each from its own secret.

    Raises:
        ConfigError: As :func:`central_noise_seed`.
    """
    fed = config.federation
    if fed.central_privacy is None or fed.aggregation != "plain":
        return None
    return central_noise_seed(config)
