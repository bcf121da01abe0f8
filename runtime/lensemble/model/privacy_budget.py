"""A participant's differential-privacy budget, counted with Opacus' accountants.

DP-SGD with Poisson sampling at rate ``q`` and Gaussian noise of multiplier ``sigma`` is the
subsampled Gaussian mechanism, composed once per inner step. Opacus' accountants compute the
epsilon it spends at a given delta: ``rdp`` (Renyi DP of the subsampled Gaussian, Mironov,
Talwar and Zhang 2019, converted as in Balle et al. 2020) or ``prv`` (privacy random variables,
Gopi, Lee and Wutschitz 2021). Nothing here computes privacy itself: every number comes from
``opacus.accountants``. The participant holds its own :class:`PrivacyBudget`; nothing the
coordinator sends reaches it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lensemble.errors import PrivacyBudgetExhausted

if TYPE_CHECKING:
    from lensemble.config.schema import PrivacyConfig


def spent_epsilon(
    noise_multiplier: float, sample_rate: float, steps: int, delta: float, accountant: str
) -> float:
    """Epsilon spent by ``steps`` DP-SGD steps, at ``delta``, by Opacus' ``accountant``.

    Args:
        noise_multiplier: sigma, the noise's standard deviation over the clipping norm.
        sample_rate: q, each record's probability of being drawn in a step.
        steps: Steps taken (count); 0 spends nothing.
        delta: The guarantee's delta (probability).
        accountant: ``rdp`` or ``prv``.

    Returns:
        Epsilon (unitless, >= 0).
    """
    if steps <= 0:
        return 0.0
    from opacus.accountants import create_accountant

    counter = create_accountant(mechanism=accountant)
    # One entry: the same mechanism composed `steps` times (the accountants' own history form).
    counter.history = [(noise_multiplier, sample_rate, steps)]
    return float(counter.get_epsilon(delta=delta))


def planned_noise_multiplier(privacy: PrivacyConfig, planned_steps: int) -> float:
    """sigma: ``privacy.noise_multiplier``, or the smallest that spends ``epsilon`` over the plan.

    Args:
        privacy: The participant's own settings.
        planned_steps: Inner steps of the whole run (``rounds * inner_steps``).

    Returns:
        The noise multiplier (unitless, > 0), from ``opacus.accountants.utils
        .get_noise_multiplier`` when not set.
    """
    if privacy.noise_multiplier is not None:
        return privacy.noise_multiplier
    from opacus.accountants.utils import get_noise_multiplier

    return float(
        get_noise_multiplier(
            target_epsilon=privacy.epsilon,
            target_delta=privacy.delta,
            sample_rate=privacy.sample_rate,
            steps=max(planned_steps, 1),
            accountant=privacy.accountant,
        )
    )


@dataclass
class PrivacyBudget:
    """What one participant has spent of its epsilon, and what it refuses to spend.

    Attributes:
        participant_id: Names the participant in the refusal.
        privacy: Its own settings (``federation.participants[i].privacy``).
        noise_multiplier: sigma in use (:func:`planned_noise_multiplier`).
        steps: DP-SGD steps taken so far (count).
    """

    participant_id: str
    privacy: PrivacyConfig
    noise_multiplier: float
    steps: int = 0

    def epsilon_after(self, more_steps: int) -> float:
        """Epsilon spent once ``more_steps`` further steps are taken (unitless)."""
        p = self.privacy
        return spent_epsilon(
            self.noise_multiplier, p.sample_rate, self.steps + more_steps, p.delta, p.accountant
        )

    @property
    def spent(self) -> float:
        """Epsilon spent so far, at the participant's delta (unitless)."""
        return self.epsilon_after(0)

    def require(self, more_steps: int, round_index: int) -> None:
        """Refuse a round of ``more_steps`` steps that would take the spend past the budget.

        Raises:
            PrivacyBudgetExhausted: The round would spend more than ``privacy.epsilon``.
        """
        after = self.epsilon_after(more_steps)
        if after > self.privacy.epsilon:
            raise PrivacyBudgetExhausted(
                f"participant '{self.participant_id}' sits out round {round_index} and every "
                f"later one: training it would spend epsilon {after:.3f} at delta "
                f"{self.privacy.delta:g}, past its budget of {self.privacy.epsilon:g} "
                f"(spent so far: {self.spent:.3f});",
                remediation="the run goes on without it while the quorum allows; a larger "
                "privacy.epsilon or noise_multiplier lets it take part longer.",
            )
