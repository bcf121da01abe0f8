"""Every cross-field rule of ``LensembleConfig``, written once.

A :class:`~lensemble.config.rule_scopes.Rule` is data: the field it names, the condition (in
the small language of :mod:`lensemble.config.rule_language`) and the message with the fix. From
that one definition

- ``LensembleConfig`` checks a config (:func:`problems`, one ``ConfigProblem`` per violation);
- the Helm chart's ``templates/_rules.tpl`` is generated (:mod:`lensemble.render.chart_rules`,
  by ``tools/regenerate.py``), so the chart refuses the same config naming the same field with
  the same message; and
- where JSON Schema can say a rule exactly, its JSON Schema form joins the config's schema
  (``allOf`` of ``config/lensemble.schema.json``, and so of the chart's ``values.schema.json``).

The scopes a rule is checked in, and the names they offer, are :mod:`lensemble.config.rule_scopes`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lensemble.config.physics import KNOWN_PHYSICS
from lensemble.config.privacy_rules import PRIVACY_RULES
from lensemble.config.rule_language import (
    NotExpressible,
    at,
    guard_schema,
    parsed,
    value_schema,
    within,
)
from lensemble.config.rule_scopes import SCOPES, Rule, Scope, scoped_values
from lensemble.config.sections import (
    CUDA_TAG,
    RESERVED_AGGREGATIONS,
    RESERVED_PARTICIPANT_IDS,
    UNPINNED_TAG,
    UNPINNED_TAG_ALLOWED_IN,
)
from lensemble.errors import ConfigProblem

if TYPE_CHECKING:
    from lensemble.config.schema import LensembleConfig


# ------------------------------------------------------------------------ the physics tables
def _physics_schema(rule: Callable[[str, tuple[Any, ...]], dict[str, Any]]) -> dict[str, Any]:
    """Per known environment: if ``data.env_id`` is it, every participant's env_params obey."""
    return {
        "allOf": [
            {
                "if": at(["data", "env_id"], {"const": env_id}),
                "then": within(
                    ["federation", "participants"],
                    {"items": {"properties": {"env_params": rule(env_id, params)}}},
                ),
            }
            for env_id, params in KNOWN_PHYSICS.items()
        ]
    }


def _known_keys() -> dict[str, Any]:
    return _physics_schema(
        lambda _, params: {
            "properties": {p.name: {} for p in params},
            "additionalProperties": False,
        }
    )


def _usable_values() -> dict[str, Any]:
    return _physics_schema(
        lambda _, params: {"properties": {p.name: {"exclusiveMinimum": p.minimum} for p in params}}
    )


# -------------------------------------------------------------------------------- the rules
NETWORK = "c.federation.transport == 'network'"
SOVEREIGN = "c.deployment.environment == 'sovereign-prod'"
MASKING = "c.federation.aggregation == 'masking'"
RANKED = "world > 1"
_RESERVED_IDS = ", ".join(RESERVED_PARTICIPANT_IDS)

RULES: tuple[Rule, ...] = (
    # ------------------------------------------------------------------ participants
    Rule(
        "reserved-participant-id",
        "participant",
        "federation.participants[{i}].id",
        f"p.id not in {RESERVED_PARTICIPANT_IDS!r}",
        f"'{{p.id}}' is a reserved role name ({_RESERVED_IDS}) and would share certificates "
        "and names with that role; choose another id.",
    ),
    Rule(
        "unique-participant-id",
        "participant",
        "federation.participants[{i}].id",
        "first_id < 0",
        "'{p.id}' is already used by participants[{first_id}]; give every participant a unique id.",
    ),
    Rule(
        "known-physics-parameter",
        "env_param",
        "federation.participants[{i}].env_params.{key}",
        "known_key",
        "'{key}' is not a physics parameter of {c.data.env_id}; use one of {names}.",
        schema=_known_keys,
    ),
    Rule(
        "usable-physics-value",
        "env_param",
        "federation.participants[{i}].env_params.{key}",
        "value > minimum",
        "{value} is not a usable value; use a finite number above {minimum} (default {default}).",
        when="known_key",
        schema=_usable_values,
    ),
    *PRIVACY_RULES,
    # ---------------------------------------------------------------- federation
    Rule(
        "quorum-within-participants",
        "config",
        "federation.quorum",
        "1 <= c.federation.quorum and c.federation.quorum <= n",
        "{c.federation.quorum} is outside 1..{n} (the number of participants); set "
        "federation.quorum between 1 and {n}.",
    ),
    Rule(
        "supported-aggregation",
        "config",
        "federation.aggregation",
        f"c.federation.aggregation not in {RESERVED_AGGREGATIONS!r}",
        "'{c.federation.aggregation}' is not yet supported; use 'plain' or 'masking' "
        "(aggregation in a trusted execution environment is reserved for a later release).",
    ),
    # The overlapped round is built for plain aggregation (docs/performance.md).
    Rule(
        "overlap-needs-plain-aggregation",
        "config",
        "federation.overlap.mode",
        "c.federation.aggregation == 'plain'",
        "'one_round' is not built for aggregation '{c.federation.aggregation}' yet; set "
        "federation.overlap.mode: blocking or federation.aggregation: plain.",
        when="c.federation.overlap.mode == 'one_round'",
    ),
    Rule(
        "overlap-without-outer-momentum",
        "config",
        "federation.outer_optimizer.momentum",
        "c.federation.outer_optimizer.momentum == 0",
        "{c.federation.outer_optimizer.momentum} with federation.overlap.mode one_round: outer "
        "momentum on a base one round old ended worse than momentum 0 in every run measured "
        "(1.01-1.9x the error, docs/performance.md); set federation.outer_optimizer.momentum: 0.",
        when="c.federation.overlap.mode == 'one_round'",
    ),
    Rule(
        "lr-hold-without-half-life",
        "config",
        "federation.outer_optimizer.lr_hold_rounds",
        "c.federation.outer_optimizer.lr_half_life_rounds is not None",
        "{c.federation.outer_optimizer.lr_hold_rounds} holds the outer learning rate before a "
        "decay that is not set; set federation.outer_optimizer.lr_half_life_rounds or remove "
        "lr_hold_rounds.",
        when="c.federation.outer_optimizer.lr_hold_rounds is not None",
    ),
    # Secure aggregation (docs/security.md#secure-aggregation-masking-the-protocol).
    Rule(
        "masking-threshold",
        "config",
        "federation.masking.threshold",
        "half < c.federation.masking.threshold and c.federation.masking.threshold <= n",
        "{c.federation.masking.threshold} is not above half of the {n} participants or exceeds "
        "them; set it above {half} and at most {n}, or null for the default floor(2n/3) + 1.",
        when=f"{MASKING} and c.federation.masking.threshold is not None",
    ),
    # lensemble.federation.secagg.fixed_point.FixedPoint.check_headroom, on the config.
    Rule(
        "masking-headroom",
        "config",
        "federation.masking.fractional_bits",
        "c.federation.masking.fractional_bits <= widest_bits",
        "{n} participants times clip {c.federation.masking.clip} times "
        "2**{c.federation.masking.fractional_bits} exceeds 2**63 - 1, so the masked sum could "
        "overflow; use at most {widest_bits} (or null for the widest that fits) or lower "
        "federation.masking.clip.",
        when=f"{MASKING} and c.federation.masking.fractional_bits is not None",
    ),
    # A sum needs max(quorum, 3, t) survivors: quorum <= n and t <= n are the rules above, so
    # what is left is n >= 3.
    Rule(
        "masking-survivors",
        "config",
        "federation.participants",
        "3 <= n",
        "{n} participants are too few for masking: every masked sum needs at least 3 inputs "
        "(with two, each learns the other's update); use 3 or more participants or "
        "federation.aggregation: plain.",
        when=MASKING,
    ),
    Rule(
        "masking-sends-fixed-point",
        "config",
        "federation.quantization",
        "c.federation.quantization == 'none'",
        "'{c.federation.quantization}' cannot be masked: the masked upload is 64-bit fixed "
        "point, never int8, bf16 or fp16; set federation.quantization: none or "
        "federation.aggregation: plain.",
        when=MASKING,
    ),
    # Over the network each participant signs its masked rounds' keys with its mTLS key, and
    # its peers check that key against their CA (lensemble.network.participant.masked_round).
    Rule(
        "masking-needs-client-certificates",
        "config",
        "network.tls.client_auth",
        "c.network.tls.enabled == True and c.network.tls.client_auth == True",
        "masking over the network needs client certificates: every participant signs its "
        "secure-aggregation keys with the key of its client certificate, so set "
        "network.tls.enabled: true and network.tls.client_auth: true (network.auth: mtls), or "
        "federation.aggregation: plain.",
        when=f"{MASKING} and {NETWORK}",
    ),
    Rule(
        "int8-chunk-needs-int8",
        "config",
        "federation.int8_chunk",
        "c.federation.int8_chunk == 0",
        "{c.federation.int8_chunk} only applies to int8; set federation.quantization: int8 or "
        "federation.int8_chunk: 0.",
        when="c.federation.quantization != 'int8'",
    ),
    # Rejecting at the median leaves about half of the honest updates out of every round.
    Rule(
        "reject-needs-headroom",
        "config",
        "federation.robustness.norm_bound_mode",
        "c.federation.robustness.median_factor is None "
        "or c.federation.robustness.median_factor >= 2",
        "'reject' with median_factor {c.federation.robustness.median_factor} leaves every "
        "update above that multiple of the median norm out of the round (about half of them "
        "at 1); set federation.robustness.median_factor to 2 or more, or use norm_bound_mode "
        "'clip'.",
        when="c.federation.robustness.norm_bound_mode == 'reject'",
    ),
    # Residency is mandatory across a real network boundary (docs/concepts.md#residency).
    Rule(
        "residency-over-network",
        "config",
        "data.residency_enforced",
        "c.data.residency_enforced == True",
        "false is not allowed with federation.transport 'network'; set "
        "data.residency_enforced: true.",
        when=NETWORK,
    ),
    # A timeout hierarchy that cannot deadlock: rpc < round <= join.
    Rule(
        "rpc-within-round",
        "config",
        "network.rpc_timeout_s",
        "c.network.rpc_timeout_s < c.federation.round_timeout_s",
        "{c.network.rpc_timeout_s} s must be below federation.round_timeout_s "
        "({c.federation.round_timeout_s} s) so a stuck RPC cannot outlive its round; lower it.",
    ),
    Rule(
        "join-outlasts-round",
        "config",
        "federation.join_timeout_s",
        "c.federation.join_timeout_s >= c.federation.round_timeout_s",
        "{c.federation.join_timeout_s} s must be at least federation.round_timeout_s "
        "({c.federation.round_timeout_s} s); raise it.",
    ),
    # A frozen or cut-off participant is noticed before its round would time out.
    Rule(
        "liveness-above-keepalive",
        "config",
        "network.liveness_timeout_s",
        "c.network.keepalive_s < c.network.liveness_timeout_s",
        "{c.network.liveness_timeout_s} s must exceed network.keepalive_s "
        "({c.network.keepalive_s} s), which leaves a ping no time to be answered; raise it or "
        "lower keepalive_s.",
    ),
    Rule(
        "liveness-within-round",
        "config",
        "network.liveness_timeout_s",
        "c.network.liveness_timeout_s < c.federation.round_timeout_s",
        "{c.network.liveness_timeout_s} s must be below federation.round_timeout_s "
        "({c.federation.round_timeout_s} s) so that a frozen participant is noticed before "
        "its round times out; lower it.",
    ),
    # A participant started before the coordinator retries with a capped backoff: a cap past
    # the join window can sleep through all of it (issue 41).
    Rule(
        "backoff-within-join",
        "config",
        "network.connect_backoff_max_s",
        "c.network.connect_backoff_max_s <= c.federation.join_timeout_s",
        "{c.network.connect_backoff_max_s} s is longer than federation.join_timeout_s "
        "({c.federation.join_timeout_s} s), so a participant waiting for the coordinator could "
        "sleep through the whole join window; lower it.",
    ),
    # ---------------------------------------------------------------------- data
    Rule(
        "holdout-leaves-both",
        "config",
        "data.holdout_fraction",
        "held >= 1 and held < c.data.episodes",
        "{c.data.holdout_fraction} of {c.data.episodes} episodes leaves no train or no "
        "held-out episode; choose a fraction that keeps at least one of each.",
    ),
    Rule(
        "window-within-episode",
        "config",
        "data.window",
        "c.data.window < c.data.episode_steps",
        "{c.data.window} must be below data.episode_steps ({c.data.episode_steps}); lower it.",
    ),
    Rule(
        "k-steps-within-episode",
        "config",
        "evaluation.k_steps",
        "c.evaluation.k_steps < c.data.episode_steps",
        "{c.evaluation.k_steps} must be below data.episode_steps ({c.data.episode_steps}); "
        "lower it.",
    ),
    # ------------------------------------------------------------------- network
    Rule(
        "distinct-ports",
        "config",
        "network.metrics_port",
        "c.network.port != c.network.health_port and c.network.port != c.network.metrics_port "
        "and c.network.health_port != c.network.metrics_port",
        "network.port ({c.network.port}), network.health_port ({c.network.health_port}) and "
        "network.metrics_port ({c.network.metrics_port}) must differ; give each its own port.",
    ),
    Rule(
        "distinct-download-port",
        "config",
        "network.download_port",
        "c.network.download_port not in "
        "(c.network.port, c.network.health_port, c.network.metrics_port)",
        "{c.network.download_port} is also network.port, health_port or metrics_port; give the "
        "model download its own port (or null to download over gRPC only).",
        when="c.network.download_port is not None",
    ),
    Rule(
        "tls-unless-insecure",
        "config",
        "network.tls.enabled",
        "c.network.tls.enabled == True",
        "false is not allowed with network.auth '{c.network.auth}'; enable TLS or set "
        "network.auth: insecure explicitly (never in sovereign-prod).",
        when=f"{NETWORK} and c.network.auth != 'insecure'",
    ),
    *(
        Rule(
            f"tls-{file.replace('_', '-')}",
            "config",
            f"network.tls.{file}",
            f"c.network.tls.{file} is not None",
            "is required when TLS is on; point it at a PEM file "
            "(`lensemble certs init DIR --config FILE` creates a development set).",
            when=f"{NETWORK} and c.network.tls.enabled == True",
        )
        for file in ("ca_file", "cert_file", "key_file")
    ),
    Rule(
        "mtls-client-auth",
        "config",
        "network.tls.client_auth",
        "c.network.tls.client_auth == True",
        "false is not allowed with network.auth 'mtls'; set network.tls.client_auth: true.",
        when=f"{NETWORK} and c.network.auth == 'mtls'",
    ),
    # ---------------------------------------------------------------- deployment
    Rule(
        "kueue-queue",
        "config",
        "deployment.gang_scheduling.queue",
        "c.deployment.gang_scheduling.queue != ''",
        "kueue admits pods through a LocalQueue, but none is named; set "
        "deployment.gang_scheduling.queue (e.g. queue: lensemble).",
        when="c.deployment.gang_scheduling.scheduler == 'kueue'",
    ),
    # GPUs need a CUDA build of the image.
    Rule(
        "gpus-need-cuda",
        "config",
        "deployment.image.tag",
        f"matches({CUDA_TAG.pattern!r}, c.deployment.image.tag)",
        "'{c.deployment.image.tag}' is not a CUDA build but GPUs are requested; use a tag such "
        "as '0.1.0-cu126' or set the gpu counts to 0.",
        when="c.deployment.resources.coordinator.gpu > 0 "
        "or c.deployment.resources.participant.gpu > 0",
    ),
    # config.sections.unpinned_tag_refused, which the policy check of rendered manifests uses.
    Rule(
        "pinned-tag",
        "config",
        "deployment.image.tag",
        f"c.deployment.image.tag != {UNPINNED_TAG!r}",
        "'{c.deployment.image.tag}' is not allowed in {c.deployment.environment}; pin a version "
        "tag or a 'sha-<7 hex>' tag.",
        when=f"c.deployment.environment != {UNPINNED_TAG_ALLOWED_IN!r}",
    ),
    Rule(
        "placement-of-a-trust-domain",
        "placement",
        "deployment.trust_domains.{key}",
        "key in domain_set",
        "'{key}' is not the trust domain of any participant; use one of {domains}.",
    ),
    # sovereign-prod: a real trust boundary between every pair of organisations.
    Rule(
        "sovereign-network",
        "config",
        "federation.transport",
        "c.federation.transport == 'network'",
        "'{c.federation.transport}' is not allowed in sovereign-prod; set it to 'network'.",
        when=SOVEREIGN,
    ),
    Rule(
        "sovereign-mtls",
        "config",
        "network.auth",
        "c.network.auth == 'mtls'",
        "'{c.network.auth}' is not allowed in sovereign-prod; set network.auth: mtls.",
        when=SOVEREIGN,
    ),
    Rule(
        "sovereign-confidential-compute",
        "config",
        "deployment.confidential_compute",
        "c.deployment.confidential_compute == True",
        "false is not allowed in sovereign-prod; set it to true.",
        when=SOVEREIGN,
    ),
    Rule(
        "sovereign-namespaces",
        "config",
        "deployment.namespace.strategy",
        "c.deployment.namespace.strategy == 'per-trust-domain'",
        "'{c.deployment.namespace.strategy}' is not allowed in sovereign-prod; use "
        "'per-trust-domain'.",
        when=SOVEREIGN,
    ),
    Rule(
        "sovereign-own-trust-domain",
        "participant",
        "federation.participants[{i}].trust_domain",
        "owner == ''",
        "'{p.trust_domain}' is shared with participant '{owner}'; give every participant its "
        "own trust domain in sovereign-prod.",
        when=SOVEREIGN,
    ),
    Rule(
        "sovereign-region",
        "participant",
        "federation.participants[{i}].region",
        "p.region is not None",
        "is missing for participant '{p.id}'; sovereign-prod pins every participant to an "
        "explicit region, e.g. region: eu-central-1.",
        when=SOVEREIGN,
    ),
    # ------------------------------------------------------------ rank layouts
    Rule(
        "ranks-within-episodes",
        "layout",
        "{where}.processes_per_node",
        "world <= max(train, 1)",
        "{world} ranks for {who} but only {train} training episodes to shard among them; use "
        "at most {train} ranks or raise data.episodes.",
    ),
    Rule(
        "nccl-needs-cuda",
        "layout",
        "{where}.backend",
        "cuda",
        "'nccl' for {who} needs a CUDA image, but deployment.image.tag "
        "'{c.deployment.image.tag}' names none; use a '-cuNNN' tag or backend 'gloo'.",
        when="l.backend == 'nccl'",
    ),
    Rule(
        "nccl-ranks-need-gpus",
        "layout",
        "{where}.processes_per_node",
        "gpus >= l.processes_per_node",
        "{l.processes_per_node} nccl ranks per node for {who} need as many GPUs, but "
        "deployment.resources.participant.gpu is {gpus}; raise the gpu count or lower "
        "processes_per_node.",
        when="l.backend == 'nccl'",
    ),
    Rule(
        "rendezvous-port-free",
        "layout",
        "{where}.rendezvous_port",
        "clash == ''",
        "{l.rendezvous_port} for {who} is also {clash}, and both listen on the participant's "
        "host; choose another port (e.g. 29400).",
        # Only a multi-node group listens on it; one node takes a free port (ranks.launch).
        when="l.nodes > 1",
    ),
    Rule(
        "ranks-divide-batch",
        "layout",
        "{where}.processes_per_node",
        "c.federation.inner_optimizer.batch_size % world == 0",
        "{world} ranks for {who} cannot split federation.inner_optimizer.batch_size "
        "{c.federation.inner_optimizer.batch_size} into equal shards; use a rank count that "
        "divides the batch size.",
        when=RANKED,
    ),
    Rule(
        "ranks-without-ema",
        "layout",
        "{where}.processes_per_node",
        "c.model.target != 'ema'",
        "{world} ranks for {who} with model.target 'ema': the sharded inner loop keeps no EMA "
        "target yet; use model.target 'stop_gradient' or one rank.",
        when=RANKED,
    ),
    Rule(
        "bf16-needs-nccl",
        "layout",
        "{where}.mixed_precision",
        "l.backend == 'nccl'",
        "'bf16' for {who} is GPU mixed precision and needs backend 'nccl'; use 'none' on CPU "
        "(or model.dtype: bfloat16).",
        when="l.mixed_precision == 'bf16'",
    ),
)


def rules_of(scope: Scope) -> list[Rule]:
    """The rules checked in ``scope``, in registry order."""
    return [rule for rule in RULES if rule.scope == scope]


def violations(cfg: LensembleConfig) -> list[tuple[Rule, ConfigProblem]]:
    """Each broken rule with the problem it reports, in reporting order."""
    by_scope = {scope: rules_of(scope) for scope in SCOPES}
    return [
        (rule, rule.problem(values))
        for scope, values in scoped_values(cfg)
        for rule in by_scope[scope]
        if rule.broken(values)
    ]


def problems(cfg: LensembleConfig) -> list[ConfigProblem]:
    """Every cross-field problem of ``cfg``: one per violation, naming field, value and fix."""
    return [problem for _, problem in violations(cfg)]


# ------------------------------------------------------------------------ JSON Schema
_PARTICIPANT = "federation.participants[{i}]."


def _subject(rule: Rule) -> tuple[str, list[str]]:
    """The field a rule's requirement constrains, as (scope name, path below it)."""
    if rule.scope == "participant" and rule.field.startswith(_PARTICIPANT):
        return "p", rule.field.removeprefix(_PARTICIPANT).split(".")
    if rule.scope == "config" and "{" not in rule.field:
        return "c", rule.field.split(".")
    raise NotExpressible(f"{rule.field} is not one field of the config")


def schema_of(rule: Rule) -> dict[str, Any] | None:
    """The rule as JSON Schema over the config, or None where JSON Schema cannot say it exactly.

    JSON Schema compares a field with constants; it cannot compare two fields, count, or look
    at a participant's layout over ``federation.ranks``, so those rules are the chart
    template's alone.
    """
    if rule.schema is not None:
        return rule.schema()
    try:
        subject = _subject(rule)
        then = within(subject[1], value_schema(parsed(rule.require), subject))
        if subject[0] == "p":
            then = within(["federation", "participants"], {"items": then})
        if rule.when is None:
            return then
        return {"if": guard_schema(parsed(rule.when)), "then": then}
    except NotExpressible:
        return None


def json_schemas() -> list[dict[str, Any]]:
    """The JSON Schema forms of every rule that has one (for the config schema's ``allOf``)."""
    return [schema for rule in RULES if (schema := schema_of(rule)) is not None]
