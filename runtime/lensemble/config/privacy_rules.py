"""The cross-field rules of differential privacy: a participant's own, and central DP-FedAvg.

Kept apart from :mod:`lensemble.config.rules` (which splices them into its registry, in this
order) because they are one concept: the conditions under which a privacy guarantee holds.
"""

from __future__ import annotations

from lensemble.config.rule_scopes import Rule

PRIVACY_RULES: tuple[Rule, ...] = (
    # Differential privacy is a participant's own (docs/security.md#differential-privacy).
    Rule(
        "privacy-delta-below-records",
        "participant",
        "federation.participants[{i}].privacy.delta",
        "p.privacy.delta * train < 1",
        "{p.privacy.delta} is not below 1 / {train} (the participant's training episodes): a "
        "delta that large allows releasing a whole record; lower it (1e-5 is usual).",
        when="p.privacy is not None",
    ),
    Rule(
        "privacy-one-rank",
        "participant",
        "federation.participants[{i}].privacy",
        "p.ranks is None and c.federation.ranks.nodes == 1 "
        "and c.federation.ranks.processes_per_node == 1",
        "differential privacy runs on a participant of one rank so far; remove the "
        "participant's ranks and keep federation.ranks at one node and one process, or set "
        "privacy: null.",
        when="p.privacy is not None",
    ),
    Rule(
        "privacy-needs-its-own-key",
        "participant",
        "federation.participants[{i}].privacy",
        "c.federation.transport == 'in_process' or c.network.tls.enabled",
        "over the network a participant seeds its differential-privacy noise from its own TLS "
        "key, so it needs network.tls.enabled: true (or privacy: null).",
        when="p.privacy is not None",
    ),
    # Central (user-level) differential privacy: DP-FedAvg (docs/security.md).
    Rule(
        "central-privacy-noise-or-budget",
        "config",
        "federation.central_privacy",
        "c.federation.central_privacy.noise_multiplier is not None "
        "or c.federation.central_privacy.epsilon is not None",
        "neither noise_multiplier nor epsilon is set; set noise_multiplier (the noise as a "
        "multiple of clip_norm), epsilon (the budget it is derived from), or both.",
        when="c.federation.central_privacy is not None",
    ),
    Rule(
        "central-privacy-mean",
        "config",
        "federation.robustness.aggregator",
        "c.federation.robustness.aggregator == 'mean'",
        "'{c.federation.robustness.aggregator}' has no bounded sensitivity to one participant, "
        "so central differential privacy cannot account for it; set "
        "federation.robustness.aggregator: mean or central_privacy: null.",
        when="c.federation.central_privacy is not None",
    ),
    # A bound scaled by the round's median norm lets one participant change how much every
    # other update is clipped, so the sum would move by more than clip_norm.
    Rule(
        "central-privacy-fixed-bound",
        "config",
        "federation.robustness.median_factor",
        "c.federation.robustness.median_factor is None "
        "or c.federation.robustness.norm_bound_mode == 'off'",
        "a norm bound scaled by the round's median norm lets one participant change how much "
        "the others are clipped, which central differential privacy cannot account for; set "
        "federation.robustness.median_factor: null (central_privacy.clip_norm bounds every "
        "update) or central_privacy: null.",
        when="c.federation.central_privacy is not None and c.federation.aggregation == 'plain'",
    ),
    Rule(
        "central-privacy-needs-its-own-key",
        "config",
        "federation.central_privacy",
        "c.federation.transport == 'in_process' or c.federation.aggregation != 'plain' "
        "or c.network.tls.enabled",
        "over the network the coordinator seeds its central differential-privacy noise from "
        "its own TLS key, so it needs network.tls.enabled: true (or central_privacy: null).",
        when="c.federation.central_privacy is not None",
    ),
    Rule(
        "central-privacy-aggregation",
        "config",
        "federation.central_privacy",
        "c.federation.aggregation in ('plain', 'masking')",
        "'{c.federation.aggregation}' cannot carry central differential privacy; set "
        "federation.aggregation: plain (the coordinator adds the noise) or masking (each "
        "participant adds its share), or central_privacy: null.",
        when="c.federation.central_privacy is not None",
    ),
)
