"""Central user-level differential privacy of the committed models (DP-FedAvg, issue 38).

McMahan, Ramage, Talwar and Zhang, "Learning Differentially Private Recurrent Language Models"
(ICLR 2018): each participant's pseudo-gradient is clipped to the L2 norm ``C``
(``federation.central_privacy.clip_norm``) and Gaussian noise of standard deviation ``z * C``
is added to the sum of the clipped updates, so that the sum moves by at most ``C`` when one
participant's whole contribution is replaced by zero and the noise hides that. Every
participant takes part in every round (sampling rate 1), so each round is one Gaussian
mechanism of multiplier ``z``, composed over the run by Opacus' accountant
(:mod:`lensemble.model.privacy_budget`).

Where the noise comes from:

- plain aggregation: the coordinator clips after its screening (:func:`clip_screening`) and adds
  ``N(0, (z C / n)^2)`` to the mean of the ``n`` kept updates (:func:`add_noise`), from a seed
  of its own (the run seed in the simulation, its TLS key over the network);
- masking: each participant clips its own update and adds ``N(0, z^2 C^2 / m)`` before the
  fixed-point encoding (:func:`noisy_share`), where ``m`` is the fewest survivors whose sum the
  coordinator can learn (:func:`fewest_summed`); a sum of ``s >= m`` survivors carries noise of
  variance ``z^2 C^2 s / m >= z^2 C^2``. The share's seed is the participant's masking secret.

:class:`CentralAccount` counts the noisy releases, records the spent epsilon in the attempt's
ledger line and refuses a round that would take it past ``epsilon``; :class:`CentralPrivacy` is
what the coordinator holds: the account, its secret seed and the steps of a round.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from lensemble.config.schema import CentralPrivacyConfig, LensembleConfig
from lensemble.federation.secagg.context import default_threshold
from lensemble.federation.secagg.groups import assign_groups
from lensemble.seeds import derive

if TYPE_CHECKING:
    from lensemble.federation.attempt import Attempt
    from lensemble.federation.ledger import RoundRecord
    from lensemble.federation.robustness import Screening

_log = logging.getLogger("lensemble.federation")

#: The ledger's ``defences`` key of a line whose aggregate carried central noise.
RECORD_KEY = "central_privacy"
#: HKDF info label of a participant's noise share (its masking secret is the key material).
SHARE_INFO = b"lensemble-central-dp-share-v1"
#: Fewest inputs of a masked sum (``federation_section.MIN_MASKED_INPUTS``).
MIN_SUMMED = 3

Params = dict[str, torch.Tensor]


def planned_noise_multiplier(privacy: CentralPrivacyConfig, rounds: int) -> float:
    """z: ``noise_multiplier``, or the smallest that spends ``epsilon`` over ``rounds`` rounds.

    Args:
        privacy: ``federation.central_privacy``.
        rounds: ``federation.rounds`` (one release per round, sampling rate 1).

    Returns:
        The noise multiplier (unitless, > 0), from ``opacus.accountants.utils
        .get_noise_multiplier`` when not set.
    """
    if privacy.noise_multiplier is not None:
        return privacy.noise_multiplier
    assert privacy.epsilon is not None  # rule central-privacy-noise-or-budget
    from opacus.accountants.utils import get_noise_multiplier

    return float(
        get_noise_multiplier(
            target_epsilon=privacy.epsilon,
            target_delta=privacy.delta,
            sample_rate=1.0,
            steps=max(rounds, 1),
            accountant=privacy.accountant,
        )
    )


def spent_epsilon(noise_multiplier: float, releases: int, delta: float, accountant: str) -> float:
    """Epsilon of ``releases`` Gaussian mechanisms at sampling rate 1, by Opacus' ``accountant``.

    The same use of ``opacus.accountants`` as :func:`lensemble.model.privacy_budget
    .composed_epsilon` (one history entry ``(z, q = 1, releases)``); 0 for no release.
    """
    if releases <= 0:
        return 0.0
    from opacus.accountants import create_accountant

    counter = create_accountant(mechanism=accountant)
    counter.history = [(noise_multiplier, 1.0, releases)]
    return float(counter.get_epsilon(delta=delta))


def epsilon_after(privacy: CentralPrivacyConfig, noise_multiplier: float, releases: int) -> float:
    """User-level epsilon at ``privacy.delta`` after ``releases`` noisy aggregates (unitless)."""
    return spent_epsilon(noise_multiplier, releases, privacy.delta, privacy.accountant)


# ------------------------------------------------------------------------ plain aggregation
def clip_screening(screening: Screening, clip_norm: float) -> dict[str, float]:
    """Clip every kept update to ``clip_norm``, on top of the screening's own bound.

    An update's factor in ``screening.clipped`` becomes ``clip_norm / norm`` wherever its
    screened norm exceeds ``clip_norm``; the aggregation then reads it scaled by that factor
    (float64 factor, float32 result: the clipped norm is ``clip_norm`` to float32 rounding).

    Args:
        screening: The round's screening (changed in place).
        clip_norm: C (L2 norm, unitless).

    Returns:
        Participant id -> the factor this clip set (< 1), for the ledger.
    """
    out: dict[str, float] = {}
    for pid in screening.kept_ids:
        norm = screening.norms[pid]
        if norm * screening.clipped.get(pid, 1.0) > clip_norm:
            screening.clipped[pid] = out[pid] = clip_norm / norm
    return out


def add_noise(combined: Params, std: float, seed: int) -> None:
    """Add ``N(0, std^2)`` to every element of ``combined``, in place, in sorted name order.

    Args:
        combined: Name -> float32 tensor (the round's mean pseudo-gradient).
        std: The noise's standard deviation (unitless, >= 0).
        seed: Seeds a ``torch.Generator`` (the same seed gives the same noise).
    """
    generator = torch.Generator().manual_seed(seed)
    for name in sorted(combined):
        tensor = combined[name]
        noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float64) * std
        tensor.add_(noise.to(torch.float32))


def coordinator_seed(root: int, round_index: int, attempt: int) -> int:
    """The coordinator's noise seed of one attempt, from its secret ``root`` (63-bit)."""
    return derive(root, f"central-dp:round:{round_index}:attempt:{attempt}")


# ------------------------------------------------------------------------------- masking
def fewest_summed(
    config: LensembleConfig, round_index: int, present: Collection[str] | None = None
) -> int:
    """m: the fewest survivors of any sum the coordinator can learn in round ``round_index``.

    One group: a sum needs ``max(quorum, 3, t)`` survivors. Several groups: the coordinator
    learns each group's sum, which needs ``max(3, t_g)`` of its members; m is the least of
    those, so every sum it can learn carries at least the full noise. The groups are the
    sessions' (:func:`~lensemble.federation.masking.session_contexts`): drawn from the
    attempt's present set when one was announced.

    Args:
        config: The run's config.
        round_index: The round.
        present: The attempt's present set (None: every configured participant).
    """
    fed = config.federation
    ids = sorted(present if present else config.participant_ids)
    groups = assign_groups(ids, fed.masking.group_size, config.run.root_seed, round_index).groups
    if len(config.participant_ids) // fed.masking.group_size < 2:  # one group, no present set
        return max(fed.quorum, MIN_SUMMED, fed.masking.resolved_threshold(len(ids)))
    return min(max(MIN_SUMMED, default_threshold(len(g))) for g in groups)


def share_std(
    config: LensembleConfig, round_index: int, present: Collection[str] | None = None
) -> float:
    """One participant's noise standard deviation under masking: ``z C / sqrt(m)``."""
    privacy = config.federation.central_privacy
    assert privacy is not None
    z = planned_noise_multiplier(privacy, config.federation.rounds)
    return z * privacy.clip_norm / math.sqrt(fewest_summed(config, round_index, present))


def share_seed(secret: bytes, round_index: int, attempt: int) -> int:
    """A participant's noise-share seed of one attempt: HKDF-SHA256 of its own secret."""
    info = SHARE_INFO + f":{round_index}:{attempt}".encode()
    okm = HKDF(algorithm=hashes.SHA256(), length=16, salt=None, info=info).derive(secret)
    return int.from_bytes(okm, "little")


def noisy_share(
    update: np.ndarray,
    config: LensembleConfig,
    secret: bytes,
    round_index: int,
    attempt: int,
    *,
    present: Collection[str] | None = None,
) -> np.ndarray:
    """The participant's update clipped to ``clip_norm`` plus its share of the noise.

    Args:
        update: d float32 values (the pseudo-gradient, flattened).
        config: The run's config (``federation.central_privacy`` set).
        secret: The participant's own secret bytes (its masking seed).
        round_index: The round (with ``attempt``, a fresh draw per attempt).
        attempt: The attempt.
        present: The attempt's present set its groups were drawn from (None: everyone).

    Returns:
        d float32 values: ``clip(update) + N(0, z^2 C^2 / m)``.
    """
    privacy = config.federation.central_privacy
    assert privacy is not None
    values = update.astype(np.float64)
    norm = float(np.linalg.norm(values))
    if norm > privacy.clip_norm:
        values *= privacy.clip_norm / norm
    rng = np.random.Generator(np.random.PCG64(share_seed(secret, round_index, attempt)))
    values += rng.normal(0.0, share_std(config, round_index, present), size=values.shape)
    return values.astype(np.float32)


# ------------------------------------------------------------------------------ accounting
def released(record: RoundRecord) -> bool:
    """Whether ``record``'s attempt let the coordinator see a noisy aggregate (a release)."""
    return RECORD_KEY in record.defences and bool(record.defences[RECORD_KEY].get("released"))


@dataclass
class CentralAccount:
    """The coordinator's count of noisy releases and the epsilon they spent.

    A release is every attempt that made a noisy aggregate, committed or not: under masking
    the coordinator saw the sums of an attempt it then aborted; under plain aggregation it
    discards them, and counting them too only overstates the spend. A rollback aggregates
    nothing and releases nothing new.

    Attributes:
        privacy: ``federation.central_privacy``.
        noise_multiplier: z in use (:func:`planned_noise_multiplier`).
        releases: Noisy aggregates released so far (count).
    """

    privacy: CentralPrivacyConfig
    noise_multiplier: float
    releases: int = 0

    @classmethod
    def of(cls, config: LensembleConfig, history: Sequence[RoundRecord]) -> CentralAccount | None:
        """The run's account, its releases counted from ``history``; None when off."""
        privacy = config.federation.central_privacy
        if privacy is None:
            return None
        z = planned_noise_multiplier(privacy, config.federation.rounds)
        account = cls(privacy, z)
        account.releases = sum(1 for record in history if released(record))
        return account

    @property
    def spent(self) -> float:
        """Epsilon spent so far (unitless)."""
        return epsilon_after(self.privacy, self.noise_multiplier, self.releases)

    def refusal(self, round_index: int) -> str | None:
        """Why round ``round_index`` may not open (its release would pass the budget), or None."""
        budget = self.privacy.epsilon
        if budget is None:
            return None
        after = epsilon_after(self.privacy, self.noise_multiplier, self.releases + 1)
        if after <= budget:
            return None
        return (
            f"the central privacy budget is spent: round {round_index} would take the "
            f"user-level epsilon to {after:.3f} at delta {self.privacy.delta:g}, past "
            f"federation.central_privacy.epsilon {budget:g} (spent: {self.spent:.3f} over "
            f"{self.releases} rounds); the run ends at model version {round_index}."
        )

    def entry(self, *, noise_std: float, clipped: Mapping[str, float] | None) -> dict[str, Any]:
        """The ``defences`` entry of an attempt that releases a noisy aggregate.

        Args:
            noise_std: The noise's standard deviation on the combined update (the mean).
            clipped: Participant id -> the factor clip_norm set (plain aggregation), or None.
        """
        after = epsilon_after(self.privacy, self.noise_multiplier, self.releases + 1)
        entry: dict[str, Any] = {
            "released": True,
            "releases": self.releases + 1,
            "epsilon": float(f"{after:.6g}"),
            "delta": self.privacy.delta,
            "noise_multiplier": float(f"{self.noise_multiplier:.6g}"),
            "clip_norm": self.privacy.clip_norm,
            "accountant": self.privacy.accountant,
            "noise_std": float(f"{noise_std:.6g}"),
        }
        if clipped is not None:
            entry["clipped"] = {pid: float(f"{f:.6g}") for pid, f in sorted(clipped.items())}
        return entry

    def closed(self, record: RoundRecord) -> None:
        """Count ``record``'s release once its attempt has ended."""
        if released(record):
            self.releases += 1


class CentralPrivacy:
    """The coordinator's side of DP-FedAvg: its account, its noise seed, a round's steps.

    Args:
        config: The run's config (``federation.central_privacy`` set).
        account: The releases so far (:meth:`CentralAccount.of`).
        seed: The coordinator's secret noise seed (63-bit).
    """

    def __init__(self, config: LensembleConfig, account: CentralAccount, seed: int) -> None:
        self.config = config
        self.account = account
        self._seed = seed

    @classmethod
    def of(
        cls, config: LensembleConfig, history: Sequence[RoundRecord], seed: int | None
    ) -> CentralPrivacy | None:
        """The run's central privacy, or None when off.

        Args:
            config: The run's config.
            history: The committed and aborted lines so far (their releases are counted).
            seed: The coordinator's secret seed (the network coordinator derives it from its
                TLS key); None derives it from the run seed (the simulation).
        """
        account = CentralAccount.of(config, history)
        if account is None:
            return None
        if seed is None:
            seed = derive(config.run.root_seed, "central-dp-noise:coordinator")
        return cls(config, account, seed)

    def refusal(self, round_index: int) -> str | None:
        """Why round ``round_index`` may not open (the budget), logged once; or None."""
        refusal = self.account.refusal(round_index)
        if refusal is not None:
            _log.warning("%s", refusal)
        return refusal

    def clip(self, screening: Screening) -> dict[str, float]:
        """Clip every kept update to C on top of the screening (:func:`clip_screening`)."""
        return clip_screening(screening, self.account.privacy.clip_norm)

    def add_noise(
        self,
        current: Attempt,
        combined: Params,
        screening: Screening,
        clipped: Mapping[str, float],
    ) -> None:
        """Add ``N(0, (z C / n)^2)`` to the mean of the ``n`` kept updates; note the release.

        The noise goes on after the momentum floor (:func:`~lensemble.federation.robustness.
        lift_to_floor`): the floor (at most 0) only shortens each update, so each still
        moves the mean by at most ``C / n``.
        """
        privacy = self.account.privacy
        std = self.account.noise_multiplier * privacy.clip_norm / len(screening.kept_ids)
        machine = current.machine
        add_noise(combined, std, coordinator_seed(self._seed, machine.round_index, machine.attempt))
        current.defences[RECORD_KEY] = self.account.entry(noise_std=std, clipped=clipped)

    def note_masked(self, current: Attempt) -> None:
        """Under masking: note the release of an attempt whose sums carry the participants' noise.

        Any group's sum the coordinator learnt is a release, even when the attempt then aborts.
        """
        record = current.defences.get("masking")
        groups = record.get("groups", []) if isinstance(record, dict) else []
        summed = [g for g in groups if "sum" in g]
        if not summed:
            return
        survivors = sum(len(g["survivors"]) for g in summed)
        present = record.get("present") if isinstance(record, dict) else None
        share = share_std(self.config, current.machine.round_index, present)
        std = share * survivors**0.5 / survivors  # of the survivors' mean
        current.defences[RECORD_KEY] = self.account.entry(noise_std=std, clipped=None)

    def closed(self, record: RoundRecord) -> None:
        """Count ``record``'s release once its attempt has ended."""
        self.account.closed(record)


def recorded_epsilon_problem(entry: Mapping[str, Any]) -> str | None:
    """Why a ledger line's recorded epsilon is not what its own fields give, or None.

    Recomputes epsilon from the line's ``releases``, ``noise_multiplier``, ``delta`` and
    ``accountant`` with Opacus' accountant (tolerance 1e-4 relative: the line keeps 6 digits).
    """
    try:
        expected = spent_epsilon(
            float(entry["noise_multiplier"]),
            int(entry["releases"]),
            float(entry["delta"]),
            str(entry["accountant"]),
        )
        recorded = float(entry["epsilon"])
    except (KeyError, TypeError, ValueError) as exc:
        return f"defences.central_privacy is malformed ({exc})"
    if not math.isclose(recorded, expected, rel_tol=1e-4, abs_tol=1e-6):
        return (
            f"defences.central_privacy.epsilon is {recorded:g} but {entry['releases']} releases "
            f"at noise multiplier {entry['noise_multiplier']} spend {expected:.6g}"
        )
    return None
