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

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lensemble.errors import PrivacyBudgetExhausted

if TYPE_CHECKING:
    from lensemble.config.schema import PrivacyConfig


#: One stretch of DP-SGD steps at the same mechanism: (sigma, q, steps), Opacus' history entry.
Segment = tuple[float, float, int]


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
    return composed_epsilon([(noise_multiplier, sample_rate, steps)], delta, accountant)


def composed_epsilon(segments: list[Segment], delta: float, accountant: str) -> float:
    """Epsilon spent by stretches of steps at possibly different sigma and q, composed.

    Args:
        segments: ``(sigma, q, steps)`` stretches, in any order; empty ones spend nothing.
        delta: The guarantee's delta (probability).
        accountant: ``rdp`` or ``prv``.

    Returns:
        Epsilon (unitless, >= 0), 0 when no step was taken.
    """
    history = [(sigma, q, n) for sigma, q, n in segments if n > 0]
    if not history:
        return 0.0
    from opacus.accountants import create_accountant

    counter = create_accountant(mechanism=accountant)
    # The accountants' own history form: each entry one mechanism composed `steps` times.
    counter.history = history
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
        steps: DP-SGD steps taken at this sigma and q (count).
        earlier: Stretches taken before at another sigma or q (a resume with other
            settings), composed with the current one.
    """

    participant_id: str
    privacy: PrivacyConfig
    noise_multiplier: float
    steps: int = 0
    earlier: list[Segment] = field(default_factory=list)

    def segments(self, more_steps: int = 0) -> list[Segment]:
        """Every stretch of steps, the current one with ``more_steps`` further steps."""
        current = (self.noise_multiplier, self.privacy.sample_rate, self.steps + more_steps)
        return [*self.earlier, current]

    def epsilon_after(self, more_steps: int) -> float:
        """Epsilon spent once ``more_steps`` further steps are taken (unitless)."""
        p = self.privacy
        return composed_epsilon(self.segments(more_steps), p.delta, p.accountant)

    @property
    def spent(self) -> float:
        """Epsilon spent so far, at the participant's delta (unitless)."""
        return self.epsilon_after(0)

    def restore(self, segments: list[Segment]) -> None:
        """Take the spend a snapshot recorded, unless this process already spent more.

        The spend never goes down: an update trained and then forgotten (refused, or lost on
        the way) may still have been seen. A snapshot's last stretch continues when its sigma
        and q are the ones in use; otherwise it is kept as an earlier stretch and composed.

        Args:
            segments: ``(sigma, q, steps)`` stretches, as :meth:`segments` gave them.
        """
        if sum(n for _, _, n in segments) < sum(n for _, _, n in self.segments()):
            return
        if segments and segments[-1][:2] == (self.noise_multiplier, self.privacy.sample_rate):
            self.earlier, self.steps = list(segments[:-1]), segments[-1][2]
        else:
            self.earlier, self.steps = list(segments), 0

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
