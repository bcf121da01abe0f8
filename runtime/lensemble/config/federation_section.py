"""The ``federation`` section: participants, their rank layouts, optimizers and robustness."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field

from lensemble.config.privacy_section import CentralPrivacyConfig, PrivacyConfig
from lensemble.config.sections import DNS1123_LABEL, RESERVED_PARTICIPANT_IDS, _Section

#: The largest sum of masked words that stays an int64 (``secagg.fixed_point.WORD_LIMIT``).
MASKED_WORD_LIMIT = 2**63 - 1
#: Fewest inputs a masked sum may have: with two, each learns the other's update.
MIN_MASKED_INPUTS = 3

# -------------------------------------------------------------------------------- rank layout
#: Environment variable naming a node's rank in its participant's group (0 .. nodes - 1, default
#: 0); node rank 0 alone talks to the coordinator and hosts the rendezvous.
NODE_RANK_ENV = "LENSEMBLE_NODE_RANK"
#: Environment variable naming the host of node rank 0 (the c10d rendezvous store); default
#: ``127.0.0.1``.
RENDEZVOUS_HOST_ENV = "LENSEMBLE_RENDEZVOUS_HOST"


class RankLayout(_Section):
    """How one participant's inner loop is spread over processes (ranks).

    A participant with more than one rank runs its inner loop under torch's elastic launcher
    (``torch.distributed.run``, the library behind ``torchrun``) with the model sharded by FSDP2
    (``torch.distributed.fsdp.fully_shard``); rank 0 alone talks to the coordinator. One rank
    (the default) is a single process, exactly as before.
    """

    nodes: int = Field(
        1,
        ge=1,
        le=64,
        description="Nodes (hosts or pods) the participant's ranks span (count).",
    )
    processes_per_node: int = Field(
        1,
        ge=1,
        le=64,
        description="Ranks per node (count); one per GPU with nccl.",
    )
    backend: Literal["gloo", "nccl"] = Field(
        "gloo",
        description="torch.distributed backend: gloo on CPU, nccl on NVIDIA GPUs.",
    )
    mixed_precision: Literal["none", "bf16"] = Field(
        "none",
        description="FSDP2 mixed precision: none (fp32 throughout) or bf16 (bf16 compute, "
        "fp32 gradient reduction; GPUs with nccl only).",
    )
    max_restarts: int = Field(
        3,
        ge=0,
        le=100,
        description="Times the launcher restarts the participant's rank group after a rank "
        "fails (count); the participant rejoins from the next round.",
    )
    rendezvous_port: int = Field(
        29400,
        ge=1,
        le=65535,
        description="TCP port of a multi-node participant's rank rendezvous (c10d store on "
        "node 0), which the other nodes dial. A one-node group meets on a free loopback port "
        "instead, so several multi-rank participants share a host without clashing.",
    )

    @property
    def world_size(self) -> int:
        """Ranks in the participant's group: ``nodes * processes_per_node`` (count)."""
        return self.nodes * self.processes_per_node


class RankLayoutOverride(_Section):
    """Per-participant changes to ``federation.ranks``; unset fields keep the federation default."""

    nodes: int | None = Field(None, ge=1, le=64, description="See federation.ranks.nodes.")
    processes_per_node: int | None = Field(
        None, ge=1, le=64, description="See federation.ranks.processes_per_node."
    )
    backend: Literal["gloo", "nccl"] | None = Field(
        None, description="See federation.ranks.backend."
    )
    mixed_precision: Literal["none", "bf16"] | None = Field(
        None, description="See federation.ranks.mixed_precision."
    )
    max_restarts: int | None = Field(
        None, ge=0, le=100, description="See federation.ranks.max_restarts."
    )
    rendezvous_port: int | None = Field(
        None, ge=1, le=65535, description="See federation.ranks.rendezvous_port."
    )


# -------------------------------------------------------------------------------- masking
def default_threshold(participants: int) -> int:
    """Shamir's t when ``federation.masking.threshold`` is null: floor(2n/3) + 1.

    The malicious-server setting of Bonawitz et al. (CCS'17); the same number as
    ``lensemble.federation.secagg.context.default_threshold``.
    """
    return 2 * participants // 3 + 1


def widest_fractional_bits(clip: float, participants: int) -> int | None:
    """The largest f in [0, 62] with ``participants * ceil(clip * 2**f) <= 2**63 - 1``, or None.

    The same number as ``lensemble.federation.secagg.fixed_point.widest_bits``: the most
    fractional bits whose masked sum over ``participants`` cannot overflow int64.
    """
    for bits in range(62, -1, -1):
        if participants * math.ceil(clip * 2.0**bits) <= MASKED_WORD_LIMIT:
            return bits
    return None


class OverlapConfig(_Section):
    """Communication overlapped with training (``federation.overlap``; docs/performance.md).

    Under ``mode: one_round`` round t trains from the model announced one round earlier,
    ``G_{t-1}``, plus ``local_weight`` times the participant's own pseudo-gradient of round
    t - 1 (subtracted, as the outer step would): Streaming DiLoCo's merge of local and global
    parameters (Douillard et al., 2025) with a full round of overlap. A participant can then
    start round t's inner steps as soon as it has sent round t - 1's update, while the
    coordinator aggregates and the new model travels.
    """

    mode: Literal["blocking", "one_round"] = Field(
        "blocking",
        description="'blocking': round t trains from the model round t - 1 committed (DiLoCo). "
        "'one_round': from the model one round older plus the participant's own progress "
        "(federation.overlap.local_weight), so training overlaps the upload, the aggregation "
        "and the download; needs federation.outer_optimizer.momentum 0 (docs/performance.md).",
    )
    local_weight: float = Field(
        0.75,
        ge=0.0,
        le=1.0,
        description="Weight of the participant's own last pseudo-gradient in its overlapped "
        "base (unitless; 0 is the one-step-delayed outer update).",
    )


class MaskingConfig(_Section):
    """Secure aggregation by masking (``federation.aggregation: masking``; docs/security.md).

    Every participant clips each pseudo-gradient coordinate to ``[-clip, clip]``, encodes it in
    64-bit fixed point with ``fractional_bits`` fractional bits and uploads it masked; the
    coordinator learns only the sum of each group of at least ``group_size`` participants, and
    ``threshold`` Shamir shares of a participant's secrets let it remove the masks of those who
    dropped out. The section is always present; only ``masking`` reads it. Resolved values:
    :meth:`resolved_threshold` and :meth:`resolved_fractional_bits`.
    """

    clip: float = Field(
        1.0,
        gt=0.0,
        le=1e6,
        description="Public bound on every pseudo-gradient coordinate: each is clipped to "
        "[-clip, clip] before fixed-point encoding, and the round's count of clipped "
        "coordinates is reported (unitless, (0, 1e6]).",
    )
    fractional_bits: int | None = Field(
        None,
        ge=1,
        le=62,
        description="Fixed-point fractional bits f: a coordinate travels as an integer number "
        "of 2**-f (1..62). null picks the widest f whose sum over the participants cannot "
        "overflow int64 (participants * ceil(clip * 2**f) <= 2**63 - 1).",
    )
    threshold: int | None = Field(
        None,
        ge=1,
        description="Shamir threshold t: shares needed to remove a participant's masks; above "
        "half of the participants and at most all of them (count). null means floor(2n/3) + 1 "
        "for n participants.",
    )
    group_size: int = Field(
        3,
        ge=MIN_MASKED_INPUTS,
        le=1024,
        description="Fewest participants in a group whose sum the coordinator learns (count, "
        "at least 3): participants are split into groups of at least this size, one masked sum "
        "per group, so a robust aggregator still has several inputs.",
    )
    aggregate_factor: float | None = Field(
        2.0,
        ge=1.0,
        le=1e6,
        description="Bound on the L2 norm of a round's combined pseudo-gradient, as a multiple "
        "of the median of the last 5 committed rounds' (unitless, [1, 1e6], from the 4th "
        "committed round on); a larger one is scaled down to it. Under masking no single "
        "update can be screened: this bounds what the sum lets a hostile participant do to one "
        "round. null for none.",
    )

    def resolved_threshold(self, participants: int) -> int:
        """Shamir's t for ``participants``: ``threshold``, or floor(2n/3) + 1 when null."""
        return self.threshold if self.threshold is not None else default_threshold(participants)

    def resolved_fractional_bits(self, participants: int) -> int:
        """Fractional bits for ``participants``: the set value, or the widest that cannot overflow.

        The config's rules refuse a set ``fractional_bits`` that could overflow; ``clip`` is
        bounded so that some f always fits (for fewer than 9 * 10**12 participants).

        Raises:
            ValueError: Not even f = 0 fits (no valid config gets here).
        """
        if self.fractional_bits is not None:
            return self.fractional_bits
        bits = widest_fractional_bits(self.clip, participants)
        if bits is None:
            raise ValueError(f"clip {self.clip} overflows int64 over {participants} participants")
        return bits


# -------------------------------------------------------------------------------- federation
class ParticipantSpec(_Section):
    """One participant: an organisation that trains on its own data in its own trust domain."""

    id: str = Field(
        ...,
        pattern=DNS1123_LABEL,
        max_length=30,
        description="Participant id, a DNS-1123 label of at most 30 characters; it names "
        "services, volumes and certificates. Role names ("
        + ", ".join(RESERVED_PARTICIPANT_IDS)
        + ") are reserved.",
        json_schema_extra={"not": {"enum": list(RESERVED_PARTICIPANT_IDS)}},
    )
    trust_domain: str = Field(
        "",
        pattern=r"^$|" + DNS1123_LABEL,
        max_length=30,
        description="Trust domain (organisation boundary) the participant's data and compute "
        "stay in; defaults to the participant id. A DNS-1123 label.",
    )
    region: str | None = Field(
        None,
        pattern=r"^[a-z]{2,4}(-[a-z0-9]+)+$",
        description="Cloud region the participant's data must stay in, e.g. eu-central-1. "
        "Required in sovereign-prod.",
    )
    env_params: dict[str, float] = Field(
        default_factory=dict,
        description="Physics overrides for this participant's environment, e.g. "
        "{g: 9.0, m: 1.2, l: 0.8} for Pendulum-v1 (units of the environment).",
    )
    ranks: RankLayoutOverride | None = Field(
        None,
        description="This participant's rank layout, field by field over federation.ranks "
        "(e.g. {processes_per_node: 2}).",
    )
    privacy: PrivacyConfig | None = Field(
        None,
        description="Record-level differential privacy this participant applies to its own "
        "training (DP-SGD with its own budget); null trains without it. In-process "
        "simulation only so far.",
    )


#: An AdamW moment decay rate: torch refuses anything outside [0, 1).
AdamBeta = Annotated[float, Field(ge=0.0, lt=1.0)]


class InnerOptimizerConfig(_Section):
    """AdamW run by each participant for ``inner_steps`` steps per round (DiLoCo inner loop)."""

    name: Literal["adamw"] = Field("adamw", description="Inner optimizer (AdamW).")
    lr: float = Field(3e-4, gt=0.0, le=10.0, description="Learning rate (unitless).")
    betas: tuple[AdamBeta, AdamBeta] = Field(
        (0.9, 0.999), description="AdamW moment decay rates (beta1, beta2), each in [0, 1)."
    )
    eps: float = Field(1e-8, gt=0.0, description="AdamW denominator epsilon (unitless).")
    weight_decay: float = Field(0.0, ge=0.0, description="Decoupled weight decay (unitless).")
    batch_size: int = Field(64, ge=1, le=1_000_000, description="Samples per inner step (count).")


class OuterOptimizerConfig(_Section):
    """SGD with Nesterov momentum applied by the coordinator to the mean pseudo-gradient."""

    name: Literal["sgd"] = Field("sgd", description="Outer optimizer (SGD, DiLoCo).")
    lr: float = Field(0.7, gt=0.0, le=10.0, description="Outer learning rate (unitless).")
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="Momentum coefficient (unitless).")
    nesterov: bool = Field(True, description="Use Nesterov momentum (DiLoCo's default).")
    lr_half_life_rounds: float | None = Field(
        None,
        gt=0.0,
        le=100_000.0,
        description="The outer learning rate halves every this many rounds (lr * 0.5 ** "
        "(version / half-life)); null keeps it constant.",
    )
    momentum_half_life_rounds: float | None = Field(
        None,
        gt=0.0,
        le=100_000.0,
        description="The momentum coefficient halves every this many rounds; null keeps it "
        "constant.",
    )
    lr_hold_rounds: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="The outer learning rate stays at lr for this many rounds before "
        "lr_half_life_rounds starts halving it (lr * 0.5 ** (max(0, version - hold) / "
        "half-life)); null starts the decay at round 0. Needs lr_half_life_rounds.",
    )


class DivergenceGuardConfig(_Section):
    """The divergence guard: roll back when the participants' held-out reports vouch it got worse.

    Each participant reports the held-out loss of the model it received; a round whose model is
    worse than the best judged one by more than ``margin`` for a strict majority of the
    reporting participants, ``patience`` judged rounds in a row, commits the best model (and its
    outer momentum) again instead of its aggregate, and the ledger says why and whom it
    suspects (docs/security.md#the-divergence-guard).
    """

    enabled: bool = Field(
        True,
        description="Judge every round's model and roll back when it diverges; false records "
        "the reports only.",
    )
    margin: float = Field(
        0.5,
        gt=0.0,
        le=100.0,
        description="A participant vouches that a model is worse than the best one when its "
        "held-out loss is more than 1 + margin times its loss of the best one (unitless, "
        "(0, 100]); once degraded, 1 + margin / 2 keeps the streak going.",
    )
    patience: int = Field(
        2,
        ge=1,
        le=1000,
        description="Consecutive degraded judged rounds before the guard rolls back (count).",
    )
    min_reporters: int = Field(
        3,
        ge=3,
        le=1024,
        description="Fewest participants whose reports on both models a round needs to be "
        "judged (count, at least 3 so that one liar is outvoted).",
    )


class RobustnessConfig(_Section):
    """Defences of the coordinator against poisoned updates (docs/security.md).

    Every update's L2 norm is bounded (clipped or rejected) before aggregation, int8 scales are
    bounded when an update is judged, the aggregator may be a coordinate-wise robust one, the
    new global model is checked before it is committed, and the divergence guard rolls back a
    model the participants' held-out reports say got worse. By default every update is clipped
    to the round's median norm before the mean, so one hostile participant of ``n`` moves the
    model by at most ``1 / n`` of a median update per round, whatever it sends.
    """

    aggregator: Literal["mean", "trimmed_mean", "median"] = Field(
        "mean",
        description="How the screened updates are combined, always in canonical participant "
        "order: 'mean' (DiLoCo's average), 'trimmed_mean' (per coordinate, drop the "
        "trim_fraction largest and smallest values, average the rest) or 'median' (per "
        "coordinate; the mean of the two middle values for an even count).",
    )
    trim_fraction: float = Field(
        0.25,
        ge=0.0,
        lt=0.5,
        description="For 'trimmed_mean': the fraction of contributors dropped at each end of "
        "every coordinate, rounded up, at most (n - 1) // 2 (unitless, [0, 0.5)).",
    )
    norm_bound_mode: Literal["off", "clip", "reject"] = Field(
        "clip",
        description="What happens to an update whose L2 norm exceeds the bound: 'clip' scales "
        "it down to the bound, 'reject' leaves it out of the round (raise median_factor with "
        "it: at 1 every update above the median is left out), 'off' disables the bound.",
    )
    norm_bound: float | None = Field(
        None,
        gt=0.0,
        le=1e30,
        description="Absolute bound on an update's L2 norm (unitless, (0, 1e30]); null for none. "
        "With median_factor too, the smaller bound applies.",
    )
    median_factor: float | None = Field(
        1.0,
        ge=1.0,
        le=1e6,
        description="Bound on an update's L2 norm as a multiple k of the median norm of the "
        "round's contributors (unitless, [1, 1e6]); null for none. The default 1 clips every "
        "update above the median to it: bounded influence per participant at a cost within "
        "noise on heterogeneous sites (docs/security.md).",
    )
    momentum_cosine_floor: float | None = Field(
        -0.3,
        ge=-1.0,
        le=0.0,
        description="Lowest cosine with the outer momentum an update keeps: the part of a "
        "kept update that pulls against the momentum's direction beyond this cosine is taken "
        "out of the mean (unitless, [-1, 0]; null for none). Honest updates of our sites stay "
        "above -0.25; inner-product manipulation sends about -0.75 (docs/security.md).",
    )
    set_aside_suspects: bool = Field(
        True,
        description="Leave out of the round's mean the updates of participants whose "
        "suspicion score after the last committed round reaches 1 (named suspects), while they "
        "are fewer than half of the round's updates; the ledger records whom and why "
        "(defences.set_aside). False only clips them (docs/security.md).",
    )
    max_int8_scale: float = Field(
        10.0,
        gt=0.0,
        le=1e30,
        description="Largest int8 scale accepted; an update with a larger one is rejected "
        "(out_of_bounds). Decoded values stay within 127 times it (unitless, (0, 1e30]).",
    )
    max_relative_change: float = Field(
        10.0,
        gt=0.0,
        le=1e6,
        description="Pre-commit check: the new global model must be finite and differ from the "
        "current one by at most this multiple of max(1, the current model's L2 norm); otherwise "
        "the attempt aborts instead of committing (unitless, (0, 1e6]).",
    )
    guard: DivergenceGuardConfig = Field(default_factory=DivergenceGuardConfig)


class FederationConfig(_Section):
    """Participants, rounds, optimizers, quorum, timeouts and wire format."""

    participants: list[ParticipantSpec] = Field(
        default_factory=list,
        description="The participants. Alternatively give participant_count and let Lensemble "
        "generate them; listed participants come first.",
    )
    participant_count: int = Field(
        0,
        ge=0,
        le=1024,
        description="Number of participants (count). Shorthand: the participants list is "
        "truncated or extended with generated participants to this count; 0 means 'as listed' "
        "(4 if none are listed).",
    )
    rounds: int = Field(20, ge=1, le=1_000_000, description="Outer rounds to run (count).")
    inner_steps: int = Field(
        25, ge=1, le=1_000_000, description="H: inner AdamW steps per participant per round."
    )
    inner_optimizer: InnerOptimizerConfig = Field(default_factory=InnerOptimizerConfig)
    outer_optimizer: OuterOptimizerConfig = Field(default_factory=OuterOptimizerConfig)
    quorum: int = Field(
        0,
        ge=0,
        description="Minimum contributors for a round to commit (count). 0 means a strict "
        "majority of participants.",
    )
    round_timeout_s: float = Field(
        120.0,
        gt=0.0,
        description="Seconds the coordinator collects updates after opening a round before it "
        "completes with whoever submitted (if at least quorum). Must exceed rpc_timeout_s.",
    )
    straggler_factor: float | None = Field(
        3.0,
        ge=1.0,
        le=1000.0,
        description="Once quorum has submitted, the coordinator waits for the rest until this "
        "many times the recent collection time (median of the last committed rounds' "
        "extra.collect_s in the ledger), at least straggler_min_s after the opening; a "
        "participant still missing then is excluded as 'straggler'. null waits until "
        "round_timeout_s.",
    )
    straggler_min_s: float = Field(
        10.0,
        ge=0.0,
        description="The shortest wait (seconds from the opening) before quorum may close a "
        "round without its stragglers, so that jitter never excludes anyone from short rounds.",
    )
    join_timeout_s: float = Field(
        600.0,
        gt=0.0,
        description="Seconds the coordinator waits for quorum participants to join before the "
        "first round. Must be at least round_timeout_s.",
    )
    max_round_retries: int = Field(
        2,
        ge=0,
        le=1000,
        description="Times an aborted round (quorum not reached) is retried before the run "
        "stops with an error (count).",
    )
    transport: Literal["in_process", "network"] = Field(
        "in_process",
        description="How coordinator and participants talk: 'in_process' (deterministic "
        "simulation in one process) or 'network' (separate processes over gRPC).",
    )
    quantization: Literal["none", "fp16", "bf16", "int8"] = Field(
        "none", description="Wire format of pseudo-gradients: none (float32), fp16, bf16, int8."
    )
    int8_chunk: int = Field(
        0,
        ge=0,
        description="Elements per int8 scale; 0 means one scale per tensor (count).",
    )
    robustness: RobustnessConfig = Field(default_factory=RobustnessConfig)
    final_model: Literal["last", "best_reported"] = Field(
        "last",
        description="Which committed version a run ends with. 'last': the last one. "
        "'best_reported': the version with the lowest median held-out loss its kept "
        "contributors reported (at least quorum reports; one liar cannot move a median), "
        "recorded in each ledger line (defences.best_reported); the last version is scored "
        "by nobody, so the choice is among the versions before it.",
    )
    ranks: RankLayout = Field(
        default_factory=RankLayout,
        description="Default rank layout of every participant's inner loop; a participant's "
        "own ranks override it field by field.",
    )
    aggregation: Literal["plain", "masking", "tee"] = Field(
        "plain",
        description="How pseudo-gradients are combined. 'plain': canonical-order mean on the "
        "coordinator. 'masking': secure aggregation, the coordinator learns only sums of "
        "masked fixed-point updates (federation.masking; in process or over the network with "
        "mTLS). "
        "'tee' is reserved and not yet supported.",
    )
    masking: MaskingConfig = Field(
        default_factory=MaskingConfig,
        description="Secure aggregation's parameters; read only under aggregation 'masking'.",
    )
    overlap: OverlapConfig = Field(
        default_factory=OverlapConfig,
        description="Communication overlapped with training (mode blocking or one_round).",
    )
    central_privacy: CentralPrivacyConfig | None = Field(
        None,
        description="User-level differential privacy of the committed models (DP-FedAvg: "
        "per-participant clipping and Gaussian noise on the sum; docs/security.md); null for "
        "none.",
    )
