"""Differential privacy sections: a participant's own record-level DP-SGD and central DP-FedAvg."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from lensemble.config.sections import _Section


# ------------------------------------------------------------------------ central privacy
class CentralPrivacyConfig(_Section):
    """User-level differential privacy of the committed models (DP-FedAvg; docs/security.md).

    McMahan et al., "Learning Differentially Private Recurrent Language Models" (ICLR 2018):
    every participant's pseudo-gradient is clipped to the L2 norm ``clip_norm`` and Gaussian
    noise of standard deviation ``noise_multiplier * clip_norm`` is added to their sum, so the
    committed models hide what any one participant's whole contribution was. Under plain
    aggregation the coordinator clips and adds the noise (the participants trust it); under
    ``masking`` each participant clips its own update and adds its share of the noise before
    masking, so that the sum carries it. The coordinator counts the epsilon spent with Opacus'
    accountant (every participant in every round: sampling rate 1) and opens no round that
    would take it past ``epsilon``.
    """

    clip_norm: float = Field(
        ...,
        gt=0.0,
        le=1e6,
        description="C: every participant's pseudo-gradient is clipped to this L2 norm before "
        "the sum (unitless, (0, 1e6]); pick it near the updates' median norm (the ledger's "
        "defences.norms).",
    )
    noise_multiplier: float | None = Field(
        None,
        gt=0.0,
        le=1000.0,
        description="z: the sum's noise standard deviation as a multiple of clip_norm "
        "(unitless, (0, 1000]); null derives it from epsilon over federation.rounds rounds.",
    )
    epsilon: float | None = Field(
        None,
        gt=0.0,
        le=1000.0,
        description="The run's user-level privacy budget (unitless, (0, 1000]): the coordinator "
        "opens no round that would take the spent epsilon, at delta, past it, and the run ends "
        "there. null for no budget (noise_multiplier must then be set; the spent epsilon is "
        "still recorded).",
    )
    delta: float = Field(
        1e-5,
        gt=0.0,
        lt=1.0,
        description="delta of the user-level (epsilon, delta) guarantee (probability, (0, 1)); "
        "keep it well below 1 / the number of participants.",
    )
    accountant: Literal["rdp", "prv"] = Field(
        "rdp",
        description="Opacus' privacy accountant: 'rdp' (Renyi DP, Mironov 2017) or 'prv' "
        "(privacy random variables, Gopi et al. 2021; tighter).",
    )


# -------------------------------------------------------------------------------- privacy
class PrivacyConfig(_Section):
    """Record-level differential privacy a participant applies to its own inner loop (DP-SGD).

    The participant's own setting, in its own entry of ``federation.participants``: nothing the
    coordinator sends can change it. A record is one of the participant's training episodes.
    Each inner step draws every record with probability ``sample_rate`` (Poisson sampling),
    takes ``windows_per_record`` windows of each drawn record, clips each record's gradient to
    ``max_grad_norm`` and adds Gaussian noise of standard deviation ``noise_multiplier *
    max_grad_norm`` to their sum before the AdamW step (Abadi et al., CCS'16). The participant
    counts what it spent with Opacus' accountant after every round and sits out (``privacy_budget``)
    the first round that would take it past ``epsilon`` (docs/security.md).
    """

    epsilon: float = Field(
        ...,
        gt=0.0,
        le=1000.0,
        description="The participant's total privacy budget epsilon over the run (unitless, "
        "(0, 1000]): it trains no round that would take its spent epsilon, at delta, past this. "
        "With noise_multiplier null, the noise is chosen so that training every planned round "
        "(federation.rounds * federation.inner_steps steps) spends exactly this.",
    )
    delta: float = Field(
        1e-5,
        gt=0.0,
        lt=1.0,
        description="delta of the (epsilon, delta) guarantee (probability, (0, 1)); keep it "
        "below 1 / the participant's training episodes.",
    )
    noise_multiplier: float | None = Field(
        None,
        gt=0.0,
        le=1000.0,
        description="sigma: the noise's standard deviation as a multiple of max_grad_norm "
        "(unitless, (0, 1000]); null derives it from epsilon over the planned run.",
    )
    max_grad_norm: float = Field(
        1.0,
        gt=0.0,
        le=1e6,
        description="C: every record's gradient is clipped to this L2 norm (unitless, (0, 1e6]).",
    )
    sample_rate: float = Field(
        0.25,
        gt=0.0,
        le=1.0,
        description="q: the probability that an inner step draws each training episode "
        "(probability, (0, 1]; Poisson sampling).",
    )
    windows_per_record: int = Field(
        8,
        ge=1,
        le=4096,
        description="Windows taken from each drawn episode in one inner step (count); their "
        "mean loss is the record's loss, whose gradient is clipped as one.",
    )
    accountant: Literal["rdp", "prv"] = Field(
        "rdp",
        description="Opacus' privacy accountant: 'rdp' (Renyi DP, Mironov 2017) or 'prv' "
        "(privacy random variables, Gopi et al. 2021; tighter).",
    )
