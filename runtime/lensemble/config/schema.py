"""``LensembleConfig``: the one validated source of truth that every substrate renders.

Pydantic v2, frozen, ``extra="forbid"``: an unknown key is an error, never silently ignored.
Every field carries a description with its unit so it shows in the exported JSON Schema
(``config/lensemble.schema.json``) and in editors through the yaml-language-server modeline.

Cross-field rules live in :func:`_check_rules`; each violation becomes one
:class:`~lensemble.errors.ConfigProblem` naming the field path, the value, what is expected and
the fix. All violations are reported together, not only the first.

Shorthands resolved at load time (so ``lensemble config show`` prints the resolved values):

- ``federation.participant_count`` sets the number of participants. Entries listed under
  ``federation.participants`` come first; the list is truncated to, or extended up to, that count
  with generated participants whose physics spread over the environment's range.
- ``federation.quorum`` defaults to a strict majority of participants.
- ``federation.participants[].trust_domain`` defaults to the participant id.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from lensemble.config.physics import KNOWN_PHYSICS, generated_env_params
from lensemble.errors import ConfigError, ConfigProblem

DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
#: A DNS-1123 subdomain (Kubernetes object names such as queues): labels joined by dots.
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: Names of roles and of what every deployment creates beside the participants: a participant
#: with one of these ids would share a certificate folder, a token line or a Kubernetes name
#: with them (``certs init`` would overwrite the coordinator's key pair).
RESERVED_PARTICIPANT_IDS = ("all", "coordinator", "participant", "participants")
K8S_CPU = r"^([0-9]+(\.[0-9]+)?|[0-9]+m)$"
K8S_MEMORY = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$"
CUDA_TAG = re.compile(r"(^|[-_.])cu[0-9]{3}([-_.]|$)")
#: The image tag a registry moves: it names no fixed build.
UNPINNED_TAG = "latest"
#: The only environment that may run an unpinned tag (images side-loaded on a laptop).
UNPINNED_TAG_ALLOWED_IN = "local"


def unpinned_tag_refused(environment: str, tag: str) -> bool:
    """Whether ``environment`` refuses image ``tag``: ``latest`` is refused outside local.

    The one statement of the rule; the chart's values schema encodes the same two constants.
    """
    return tag == UNPINNED_TAG and environment != UNPINNED_TAG_ALLOWED_IN


MiB = 1024 * 1024
#: ``federation.aggregation`` values reserved for a later release (refused by the rules).
RESERVED_AGGREGATIONS = ("masking", "tee")

Environment = Literal["local", "staging", "sovereign-prod"]


class _Section(BaseModel):
    # Every number must be finite: no field has a use for NaN or infinity (a timeout of
    # infinity is "never", which is what the retries and quorum are for).
    model_config = ConfigDict(
        frozen=True, extra="forbid", populate_by_name=True, allow_inf_nan=False
    )


# --------------------------------------------------------------------------------------- run
class RunConfig(_Section):
    """Identity and output of one run."""

    name: str = Field(
        "lensemble",
        pattern=DNS1123_LABEL,
        max_length=40,
        description="Name of the run: names the Helm release, Compose project and Pulumi "
        "resources. A DNS-1123 label of at most 40 characters.",
    )
    root_seed: int = Field(
        0,
        ge=0,
        lt=2**63,
        description="Root of every random seed (data collection, model init, batching), an "
        "integer in [0, 2^63). The same config and seed give a bit-identical hash chain.",
    )
    output_dir: str = Field(
        "runs/local",
        min_length=1,
        description="Directory (path) for checkpoints, ledger, metrics, plots and each "
        "participant's private data cache; relative paths resolve from the working directory.",
    )


# ------------------------------------------------------------------------------------- model
class ModelConfig(_Section):
    """The world model that is federated."""

    kind: Literal["latent-dynamics"] = Field(
        "latent-dynamics",
        description="World model architecture. 'latent-dynamics': the built-in small "
        "action-conditioned latent dynamics model (MLP encoder and predictor, JEPA-style).",
    )
    latent_dim: int = Field(16, ge=2, le=4096, description="Latent state size (count).")
    hidden_dim: int = Field(
        64, ge=4, le=65536, description="Width of hidden layers in encoder and predictor (count)."
    )
    depth: int = Field(
        2, ge=1, le=32, description="Hidden layers in the encoder and in the predictor (count)."
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Parameter dtype. Pseudo-gradients are aggregated in float32 regardless.",
    )
    target: Literal["stop_gradient", "ema"] = Field(
        "stop_gradient",
        description="JEPA target encoder: 'stop_gradient' (online encoder, no gradient) or "
        "'ema' (exponential moving average of the online encoder, kept by each participant).",
    )
    ema_decay: float = Field(
        0.99, gt=0.0, lt=1.0, description="Decay of the EMA target per inner step (unitless)."
    )
    regularizer: Literal["vicreg", "sigreg"] = Field(
        "vicreg",
        description="Anti-collapse regularizer on latents: 'vicreg' (variance + covariance) "
        "or 'sigreg' (sketched isotropic-Gaussian test, LeJEPA).",
    )
    regularizer_weight: float = Field(
        1.0, ge=0.0, description="Weight of the anti-collapse term in the loss (unitless)."
    )


# -------------------------------------------------------------------------------------- data
class DataConfig(_Section):
    """Each participant's private data: trajectories from its own environment physics."""

    env_id: str = Field(
        "Pendulum-v1",
        min_length=1,
        description="Gymnasium environment id each participant collects trajectories from "
        "(Pendulum-v1, MountainCarContinuous-v0, CartPole-v1, or any registered id).",
    )
    episodes: int = Field(
        24, ge=2, le=100000, description="Episodes each participant collects (count)."
    )
    episode_steps: int = Field(
        100, ge=2, le=100000, description="Environment steps per episode (count)."
    )
    window: int = Field(
        6,
        ge=1,
        le=1000,
        description="Consecutive transitions per training sample; the predictor is unrolled "
        "this many steps in latent space (count).",
    )
    holdout_fraction: float = Field(
        0.25,
        gt=0.0,
        lt=1.0,
        description="Fraction of each participant's episodes held out for evaluation, in (0, 1).",
    )
    residency_enforced: bool = Field(
        True,
        description="Check every outgoing payload and fail closed if anything but model-shaped "
        "pseudo-gradients would leave a participant. Must be true for the network transport.",
    )


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
        description="TCP port of the participant's rank rendezvous (c10d store on rank 0).",
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


class RobustnessConfig(_Section):
    """Defences of the coordinator against poisoned updates (docs/security.md).

    Every update's L2 norm is bounded (clipped or rejected) before aggregation, int8 scales are
    bounded when an update is judged, the aggregator may be a coordinate-wise robust one, and the
    new global model is checked before it is committed. The defaults leave an honest run's
    hash chain unchanged: the norm bound is far above honest spread and the aggregator is the
    plain mean.
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
        "it down to the bound, 'reject' leaves it out of the round, 'off' disables the bound.",
    )
    norm_bound: float | None = Field(
        None,
        gt=0.0,
        le=1e30,
        description="Absolute bound on an update's L2 norm (unitless, (0, 1e30]); null for none. "
        "With median_factor too, the smaller bound applies.",
    )
    median_factor: float | None = Field(
        10.0,
        ge=1.0,
        le=1e6,
        description="Bound on an update's L2 norm as a multiple k of the median norm of the "
        "round's contributors (unitless, [1, 1e6]); null for none.",
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
    ranks: RankLayout = Field(
        default_factory=RankLayout,
        description="Default rank layout of every participant's inner loop; a participant's "
        "own ranks override it field by field.",
    )
    aggregation: Literal["plain", "masking", "tee"] = Field(
        "plain",
        description="How pseudo-gradients are combined. 'plain': canonical-order mean on the "
        "coordinator. 'masking' and 'tee' are reserved and not yet supported.",
    )


# ----------------------------------------------------------------------------------- network
class TLSConfig(_Section):
    """TLS material for the network transport: paths only, never key material inline."""

    enabled: bool = Field(True, description="Encrypt gRPC with TLS.")
    cert_file: str | None = Field(
        None,
        description="PEM certificate of this process (path); '{identity}' in the path becomes "
        "'coordinator' or the participant id, so one config serves every process.",
    )
    key_file: str | None = Field(
        None, description="PEM private key of this process (path); '{identity}' as for cert_file."
    )
    ca_file: str | None = Field(
        None, description="PEM CA bundle that signs the peers (path); '{identity}' as above."
    )
    client_auth: bool = Field(
        False,
        description="Mutual TLS: the coordinator requires a client certificate whose SAN or CN "
        "equals the participant id.",
    )
    expiry_warning_days: int = Field(
        30,
        ge=0,
        le=3650,
        description="Days before a certificate's expiry from which processes warn at start and "
        "`lensemble certs init` renews it (days); an expired certificate is always refused.",
    )


class NetworkConfig(_Section):
    """Coordinator address, TLS, authentication and limits of the network transport."""

    host: str = Field(
        "127.0.0.1",
        min_length=1,
        description="Host name or address participants dial to reach the coordinator.",
    )
    listen_host: str = Field(
        "127.0.0.1",
        min_length=1,
        description="Address the coordinator binds (0.0.0.0 in containers).",
    )
    port: int = Field(50051, ge=1, le=65535, description="Coordinator gRPC port (TCP).")
    health_port: int = Field(
        50052,
        ge=1,
        le=65535,
        description="Plaintext port (TCP) of the standard gRPC health service every process "
        "serves, for Kubernetes gRPC probes and container healthchecks; it reveals nothing but "
        "serving status.",
    )
    download_port: int | None = Field(
        50053,
        ge=1,
        le=65535,
        description="Coordinator port (TCP) of the model download: each round's model payload "
        "over a TLS socket of its own, beside gRPC, with the same certificates, authentication "
        "and limits (gRPC's FetchModel ran at 0.7x a raw TLS socket on loopback). Participants "
        "fall back to gRPC FetchModel when it cannot be reached; null serves and uses FetchModel "
        "only.",
    )
    tls: TLSConfig = Field(default_factory=TLSConfig)
    auth: Literal["mtls", "token", "insecure"] = Field(
        "mtls",
        description="Participant authentication: 'mtls' (client certificates), 'token' "
        "(per-participant bearer tokens from token_file or LENSEMBLE_TOKEN, for development) or "
        "'insecure' (none; refused in sovereign-prod).",
    )
    token_file: str | None = Field(
        None,
        description="Path to the bearer token (participant) or to the 'id token' lines of every "
        "participant (coordinator); '{identity}' as for TLS paths. Tokens never go in the config.",
    )
    max_message_bytes: int | None = Field(
        None,
        ge=1024,
        description="Upper bound (bytes) on one FetchModel or SubmitUpdate payload, enforced "
        "before buffering. Unset: derived from the global model's wire size for "
        "federation.quantization plus header room; a value may only lower that cap, and one "
        "below the model's wire size is refused at start.",
    )
    chunk_bytes: int = Field(
        1 * MiB,
        ge=1024,
        le=64 * MiB,
        description="Bytes per streamed chunk of a model or pseudo-gradient payload.",
    )
    upload_window_bytes: int = Field(
        4 * MiB,
        ge=64 * 1024,
        le=256 * MiB,
        description="HTTP/2 flow-control window (bytes) of each update upload on the "
        "coordinator: the most one upload stream may have sent that the coordinator has not "
        "read yet. The coordinator buffers about three windows per upload in flight, so its "
        "memory grows by that much per participant uploading at once; one stream's throughput "
        "is at most window / round-trip time (4 MiB over a 50 ms link: about 80 MB/s). Raise it "
        "for long, fast links.",
    )
    rpc_timeout_s: float = Field(
        30.0,
        gt=0.0,
        description="Deadline of every unary RPC and of each streamed chunk (seconds). Must be "
        "below federation.round_timeout_s.",
    )
    connect_backoff_max_s: float = Field(
        10.0, gt=0.0, description="Cap of the exponential reconnect backoff (seconds)."
    )
    metrics_port: int = Field(
        9090, ge=1, le=65535, description="Prometheus /metrics HTTP port (TCP)."
    )
    max_calls_per_participant: int = Field(
        4,
        ge=3,
        le=64,
        description="Concurrent RPCs one authenticated participant may hold on the coordinator "
        "(count; at most one of them an update upload); the coordinator reserves this many "
        "handler threads per participant, so no participant can starve another.",
    )
    keepalive_s: float = Field(
        10.0,
        gt=0.0,
        le=3600.0,
        description="HTTP/2 keepalive ping interval (seconds) of both sides; a peer that does "
        "not answer a ping within keepalive_s is disconnected (the coordinator then counts a "
        "participant absent at once).",
    )
    max_connection_idle_s: float = Field(
        300.0,
        gt=0.0,
        description="The coordinator closes a connection that carried no call for this long "
        "(seconds).",
    )
    max_connection_age_s: float = Field(
        3600.0,
        gt=0.0,
        description="The coordinator recycles every connection after this age (seconds); calls "
        "in flight get a presence window (half this age, at most 60 s) plus two rpc_timeout_s "
        "to finish, and clients reconnect on their own.",
    )


# ----------------------------------------------------------------------------- observability
class ObservabilityConfig(_Section):
    """Logs, metrics and the round ledger."""

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Minimum level written to stderr."
    )
    log_format: Literal["auto", "json", "text"] = Field(
        "auto",
        description="stderr log format: auto is text on a terminal and JSON lines otherwise; "
        "containers use json.",
    )
    metrics_path: str = Field(
        "/metrics", pattern=r"^/", description="HTTP path of the Prometheus endpoint."
    )
    ledger_path: str = Field(
        "ledger.jsonl",
        min_length=1,
        description="Round ledger file (JSON lines, a hash chain), relative to run.output_dir.",
    )


# -------------------------------------------------------------------------------- evaluation
class EvaluationConfig(_Section):
    """Held-out evaluation that shows what federation buys."""

    k_steps: int = Field(
        5, ge=1, le=1000, description="Horizon of the k-step latent prediction error (steps)."
    )
    every_rounds: int = Field(
        1, ge=1, description="Evaluate the global model every this many rounds (count)."
    )
    local_only_baseline: bool = Field(
        True,
        description="Also train each participant alone for the same inner steps and report "
        "its held-out error next to the federated model's.",
    )
    pooled_oracle: bool = Field(
        True,
        description="Also train the pooled-data oracle: one model on every participant's "
        "training data with the federation's total inner steps (N x H per round), what "
        "training would reach without residency (simulation only).",
    )
    fedavg_ablation: bool = Field(
        True,
        description="Also run the same federation with plain averaging (outer lr 1, no "
        "momentum), the ablation of DiLoCo's outer optimizer (simulation only).",
    )
    probe_ridge: float = Field(
        1e-3, ge=0.0, description="Ridge penalty of the linear probe latent -> true state."
    )


# -------------------------------------------------------------------------------- deployment
class ImageConfig(_Section):
    """Container image every role runs (one image; the role is chosen at run time)."""

    repository: str = Field(
        "ghcr.io/lensemble/lensemble", min_length=1, description="Image repository."
    )
    tag: str = Field(
        "0.1.0-cpu",
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$",
        description="Image tag: '<version>-cpu' or '<version>-cu126' etc., or 'sha-<7 hex>'.",
    )
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Kubernetes imagePullPolicy."
    )


class RoleResources(_Section):
    """Requests and limits of one role's container."""

    cpu: str = Field("1", pattern=K8S_CPU, description="CPU cores (Kubernetes quantity).")
    memory: str = Field(
        "2Gi", pattern=K8S_MEMORY, description="Memory (Kubernetes quantity, bytes)."
    )
    gpu: int = Field(0, ge=0, le=64, description="NVIDIA GPUs (count).")


class ResourcesConfig(_Section):
    """Per-role resources."""

    coordinator: RoleResources = Field(default_factory=RoleResources)
    participant: RoleResources = Field(default_factory=RoleResources)


class NamespaceConfig(_Section):
    """Kubernetes namespace layout."""

    strategy: Literal["single", "per-trust-domain"] = Field(
        "single",
        description="'single': everything in one namespace; 'per-trust-domain': the "
        "coordinator in '<name>' and each trust domain in '<name>-<trust_domain>'.",
    )
    name: str = Field(
        "lensemble",
        pattern=DNS1123_LABEL,
        max_length=30,
        description="Namespace name (or prefix).",
    )


class Toleration(_Section):
    """A Kubernetes toleration."""

    key: str = Field(..., min_length=1, description="Taint key.")
    operator: Literal["Equal", "Exists"] = Field("Equal", description="Match operator.")
    value: str | None = Field(None, description="Taint value (with operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect."
    )


class TrustDomainPlacement(_Section):
    """Where one trust domain's pods may run."""

    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the trust domain's pods require."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Taints the trust domain's pods tolerate."
    )


class StorageConfig(_Section):
    """Volumes: participants' private data, and the coordinator's state."""

    class_name: str | None = Field(
        None, description="StorageClass of participant data volumes; null uses the default."
    )
    size: str = Field("1Gi", pattern=K8S_MEMORY, description="Volume size (Kubernetes quantity).")
    coordinator_size: str | None = Field(
        None,
        pattern=K8S_MEMORY,
        description="Coordinator state volume (checkpoints, ledger; Kubernetes quantity); null "
        "derives it from the model size and the 3 checkpoints kept (docs/run-record.md).",
    )


class CloudConfig(_Section):
    """Cloud account layout for the Pulumi stacks."""

    provider: Literal["aws"] = Field("aws", description="Cloud provider.")
    partition: Literal["aws", "aws-eusc", "aws-us-gov", "aws-cn"] = Field(
        "aws", description="AWS partition; ARNs are built from it."
    )
    region: str = Field(
        "eu-central-1",
        pattern=r"^[a-z]{2,4}(-[a-z0-9]+)+$",
        description="Region of the coordinator and shared resources.",
    )


class GangSchedulingConfig(_Section):
    """All-or-nothing admission of one participant's pods on Kubernetes, never of several.

    Off by default. It applies to a participant whose ranks span several nodes (its pod group:
    all ``nodes`` pods or none) and to a single participant pod asking for several GPUs.
    Participants are never grouped together: the outer loop is elastic and commits a round
    with a quorum.
    """

    scheduler: Literal["none", "kueue", "volcano"] = Field(
        "none",
        description="Batch scheduler that admits a participant's pods together: none, kueue "
        "(pod-group labels; Kueue's pod integration) or volcano (a PodGroup per participant).",
    )
    queue: str = Field(
        "",
        pattern=r"^$|" + DNS1123_SUBDOMAIN,
        max_length=253,
        description="Kueue LocalQueue (required with kueue) or Volcano queue (default "
        "'default') the participants' pods are admitted through.",
    )


class DeploymentConfig(_Section):
    """How the run is deployed: environment, image, resources, placement, cloud."""

    environment: Environment = Field(
        "local", description="Target environment: local, staging or sovereign-prod."
    )
    image: ImageConfig = Field(default_factory=ImageConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    namespace: NamespaceConfig = Field(default_factory=NamespaceConfig)
    trust_domains: dict[str, TrustDomainPlacement] = Field(
        default_factory=dict,
        description="Node placement per trust domain (keys are trust domain names).",
    )
    storage: StorageConfig = Field(default_factory=StorageConfig)
    gang_scheduling: GangSchedulingConfig = Field(default_factory=GangSchedulingConfig)
    confidential_compute: bool = Field(
        False,
        description="Run the coordinator on a confidential-compute node pool (AMD SEV-SNP).",
    )
    confidential_runtime_class: str | None = Field(
        None, description="RuntimeClass for the coordinator pod on confidential nodes, if any."
    )
    kube_context: str | None = Field(
        None, description="kubeconfig context of an existing cluster (local kind stacks)."
    )
    cloud: CloudConfig = Field(default_factory=CloudConfig)


# ---------------------------------------------------------------------------------- the root
class LensembleConfig(_Section):
    """The whole Lensemble configuration (schema version 1)."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        allow_inf_nan=False,
        title="LensembleConfig",
        json_schema_extra={"$id": "https://lensemble.dev/schema/lensemble-config-v1.json"},
    )

    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    federation: FederationConfig = Field(default_factory=FederationConfig)
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    observability: ObservabilityConfig = Field(default_factory=ObservabilityConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    deployment: DeploymentConfig = Field(default_factory=DeploymentConfig)

    @model_validator(mode="before")
    @classmethod
    def _resolve_shorthands(cls, data: Any) -> Any:
        return resolve_shorthands(data)

    @model_validator(mode="after")
    def _cross_field_rules(self) -> LensembleConfig:
        problems = _check_rules(self)
        if problems:
            raise ConfigError(problems)
        return self

    # Convenience views used by every renderer.
    @property
    def participant_ids(self) -> list[str]:
        """Participant ids in canonical (sorted) order, the order of every reduction."""
        return sorted(p.id for p in self.federation.participants)

    def participant(self, participant_id: str) -> ParticipantSpec:
        """The participant with this id.

        Raises:
            KeyError: No participant has that id.
        """
        for p in self.federation.participants:
            if p.id == participant_id:
                return p
        raise KeyError(participant_id)

    def rank_layout(self, participant_id: str) -> RankLayout:
        """The participant's rank layout: ``federation.ranks`` with its own overrides applied.

        Raises:
            KeyError: No participant has that id.
        """
        own = self.participant(participant_id).ranks
        if own is None:
            return self.federation.ranks
        return self.federation.ranks.model_copy(update=own.model_dump(exclude_none=True))

    @property
    def trust_domains(self) -> list[str]:
        """Distinct trust domains, sorted."""
        return sorted({p.trust_domain for p in self.federation.participants})


DEFAULT_PARTICIPANTS = 4


def resolve_shorthands(data: Any) -> Any:
    """Expand ``participant_count``, default trust domains and quorum in a raw config mapping.

    Leaves anything it does not understand alone so that field validation reports it.

    Args:
        data: The raw mapping (from YAML plus overrides).

    Returns:
        A new mapping with ``federation.participants``, ``participant_count`` and ``quorum``
        resolved.
    """
    if not isinstance(data, dict):
        return data
    fed = data.get("federation", {})
    if not isinstance(fed, dict):
        return data
    listed = fed.get("participants", [])
    if not isinstance(listed, list):
        return data
    count = fed.get("participant_count", 0)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        return data
    if count == 0:
        count = len(listed) or DEFAULT_PARTICIPANTS
    data_section = data.get("data")
    env = data_section.get("env_id", "Pendulum-v1") if isinstance(data_section, dict) else ""
    participants: list[Any] = list(listed[:count])
    used = {p.get("id") for p in participants if isinstance(p, dict)}
    index = 0
    while len(participants) < count:
        pid = f"site-{index}"
        if pid not in used:
            participants.append({"id": pid, "env_params": generated_env_params(str(env), index)})
            used.add(pid)
        index += 1
    resolved = []
    for p in participants:
        needs_domain = isinstance(p, dict) and not p.get("trust_domain")
        resolved.append({**p, "trust_domain": p["id"]} if needs_domain and "id" in p else p)
    fed = {**fed, "participants": resolved, "participant_count": count}
    quorum = fed.get("quorum", 0)
    if quorum in (0, None):
        fed["quorum"] = count // 2 + 1
    return {**data, "federation": fed}


def _check_rules(cfg: LensembleConfig) -> list[ConfigProblem]:
    """Every cross-field rule; one problem per violation, with field path and fix."""
    out: list[ConfigProblem] = []

    def bad(path: str, message: str) -> None:
        out.append(ConfigProblem(path=path, message=message))

    fed, net, dep = cfg.federation, cfg.network, cfg.deployment
    n = len(fed.participants)
    env = dep.environment

    # Participants: unique ids, sensible physics.
    seen: dict[str, int] = {}
    for i, p in enumerate(fed.participants):
        if p.id in RESERVED_PARTICIPANT_IDS:
            bad(
                f"federation.participants[{i}].id",
                f"'{p.id}' is a reserved role name ({', '.join(RESERVED_PARTICIPANT_IDS)}) "
                "and would share certificates and names with that role; choose another id.",
            )
        if p.id in seen:
            bad(
                f"federation.participants[{i}].id",
                f"'{p.id}' is already used by participants[{seen[p.id]}]; give every "
                "participant a unique id.",
            )
        seen.setdefault(p.id, i)
        known = KNOWN_PHYSICS.get(cfg.data.env_id)
        if known is not None:
            names = {k.name: k for k in known}
            for key, value in p.env_params.items():
                spec = names.get(key)
                if spec is None:
                    bad(
                        f"federation.participants[{i}].env_params.{key}",
                        f"'{key}' is not a physics parameter of {cfg.data.env_id}; use one of "
                        f"{', '.join(sorted(names))}.",
                    )
                elif not math.isfinite(value) or value <= spec.minimum:
                    bad(
                        f"federation.participants[{i}].env_params.{key}",
                        f"{value} is not a usable value; use a finite number above "
                        f"{spec.minimum} (default {spec.default}).",
                    )

    # Quorum.
    if not 1 <= fed.quorum <= n:
        bad(
            "federation.quorum",
            f"{fed.quorum} is outside 1..{n} (the number of participants); set "
            f"federation.quorum between 1 and {n}.",
        )

    # Aggregation backends that exist only as reserved names.
    if fed.aggregation in RESERVED_AGGREGATIONS:
        bad(
            "federation.aggregation",
            f"'{fed.aggregation}' is not yet supported; use 'plain' (secure aggregation is "
            "reserved for a later release).",
        )
    if fed.int8_chunk and fed.quantization != "int8":
        bad(
            "federation.int8_chunk",
            f"{fed.int8_chunk} only applies to int8; set federation.quantization: int8 or "
            "federation.int8_chunk: 0.",
        )

    # Residency is mandatory across a real network boundary (docs/concepts.md#residency).
    if fed.transport == "network" and not cfg.data.residency_enforced:
        bad(
            "data.residency_enforced",
            "false is not allowed with federation.transport 'network'; set "
            "data.residency_enforced: true.",
        )

    # Timeout hierarchy that cannot deadlock: rpc < round <= join.
    if not net.rpc_timeout_s < fed.round_timeout_s:
        bad(
            "network.rpc_timeout_s",
            f"{net.rpc_timeout_s} s must be below federation.round_timeout_s "
            f"({fed.round_timeout_s} s) so a stuck RPC cannot outlive its round; lower it.",
        )
    if not fed.join_timeout_s >= fed.round_timeout_s:
        bad(
            "federation.join_timeout_s",
            f"{fed.join_timeout_s} s must be at least federation.round_timeout_s "
            f"({fed.round_timeout_s} s); raise it.",
        )

    # Data split must leave both a train and a held-out episode.
    held = round(cfg.data.episodes * cfg.data.holdout_fraction)
    if held < 1 or held >= cfg.data.episodes:
        bad(
            "data.holdout_fraction",
            f"{cfg.data.holdout_fraction} of {cfg.data.episodes} episodes leaves no train or no "
            "held-out episode; choose a fraction that keeps at least one of each.",
        )
    out.extend(_rank_layout_problems(cfg, train_episodes=cfg.data.episodes - held))
    gang = cfg.deployment.gang_scheduling
    if gang.scheduler == "kueue" and not gang.queue:
        bad(
            "deployment.gang_scheduling.queue",
            "kueue admits pods through a LocalQueue, but none is named; set "
            "deployment.gang_scheduling.queue (e.g. queue: lensemble).",
        )

    if cfg.data.window >= cfg.data.episode_steps:
        bad(
            "data.window",
            f"{cfg.data.window} must be below data.episode_steps ({cfg.data.episode_steps}); "
            "lower it.",
        )
    if cfg.evaluation.k_steps >= cfg.data.episode_steps:
        bad(
            "evaluation.k_steps",
            f"{cfg.evaluation.k_steps} must be below data.episode_steps "
            f"({cfg.data.episode_steps}); lower it.",
        )

    # Network security.
    if len({net.port, net.health_port, net.metrics_port}) < 3:
        bad(
            "network.metrics_port",
            f"network.port ({net.port}), network.health_port ({net.health_port}) and "
            f"network.metrics_port ({net.metrics_port}) must differ; give each its own port.",
        )
    if net.download_port in {net.port, net.health_port, net.metrics_port}:
        bad(
            "network.download_port",
            f"{net.download_port} is also network.port, health_port or metrics_port; give the "
            "model download its own port (or null to download over gRPC only).",
        )
    if fed.transport == "network":
        if net.auth != "insecure" and not net.tls.enabled:
            bad(
                "network.tls.enabled",
                f"false is not allowed with network.auth '{net.auth}'; enable TLS or set "
                "network.auth: insecure explicitly (never in sovereign-prod).",
            )
        if net.tls.enabled:
            for field in ("ca_file", "cert_file", "key_file"):
                if getattr(net.tls, field) is None:
                    bad(
                        f"network.tls.{field}",
                        "is required when TLS is on; point it at a PEM file "
                        "(`lensemble certs init DIR --config FILE` creates a development set).",
                    )
        if net.auth == "mtls" and not net.tls.client_auth:
            bad(
                "network.tls.client_auth",
                "false is not allowed with network.auth 'mtls'; set network.tls.client_auth: true.",
            )

    # Placement refers to real trust domains.
    domains = {p.trust_domain for p in fed.participants}
    for key in dep.trust_domains:
        if key not in domains:
            bad(
                f"deployment.trust_domains.{key}",
                f"'{key}' is not the trust domain of any participant; use one of "
                f"{', '.join(sorted(domains))}.",
            )

    # GPUs need a CUDA build of the image.
    gpus = dep.resources.coordinator.gpu or dep.resources.participant.gpu
    if gpus and not CUDA_TAG.search(dep.image.tag):
        bad(
            "deployment.image.tag",
            f"'{dep.image.tag}' is not a CUDA build but GPUs are requested; use a tag such as "
            "'0.1.0-cu126' or set the gpu counts to 0.",
        )
    if unpinned_tag_refused(env, dep.image.tag):
        bad(
            "deployment.image.tag",
            f"'{dep.image.tag}' is not allowed in {env}; pin a version tag or a 'sha-<7 hex>' tag.",
        )

    # sovereign-prod: a real trust boundary between every pair of organisations.
    if env == "sovereign-prod":
        if fed.transport != "network":
            bad(
                "federation.transport",
                f"'{fed.transport}' is not allowed in sovereign-prod; set it to 'network'.",
            )
        if net.auth != "mtls":
            bad(
                "network.auth",
                f"'{net.auth}' is not allowed in sovereign-prod; set network.auth: mtls.",
            )
        if not dep.confidential_compute:
            bad(
                "deployment.confidential_compute",
                "false is not allowed in sovereign-prod; set it to true.",
            )
        if dep.namespace.strategy != "per-trust-domain":
            bad(
                "deployment.namespace.strategy",
                f"'{dep.namespace.strategy}' is not allowed in sovereign-prod; use "
                "'per-trust-domain'.",
            )
        owners: dict[str, str] = {}
        for i, p in enumerate(fed.participants):
            if p.trust_domain in owners:
                bad(
                    f"federation.participants[{i}].trust_domain",
                    f"'{p.trust_domain}' is shared with participant '{owners[p.trust_domain]}'; "
                    "give every participant its own trust domain in sovereign-prod.",
                )
            owners.setdefault(p.trust_domain, p.id)
            if p.region is None:
                bad(
                    f"federation.participants[{i}].region",
                    f"is missing for participant '{p.id}'; sovereign-prod pins every "
                    "participant to an explicit region, e.g. region: eu-central-1.",
                )
    return out


def _rank_layout_problems(cfg: LensembleConfig, *, train_episodes: int) -> list[ConfigProblem]:
    """Rules on the rank layouts: ``federation.ranks`` once, then each participant's override."""
    out: list[ConfigProblem] = []
    gpus = cfg.deployment.resources.participant.gpu
    cuda_image = bool(CUDA_TAG.search(cfg.deployment.image.tag))
    checks: list[tuple[str, str, RankLayout]] = [
        ("federation.ranks", "every participant", cfg.federation.ranks)
    ]
    for i, p in enumerate(cfg.federation.participants):
        if p.ranks is not None:
            own = cfg.rank_layout(p.id)
            checks.append((f"federation.participants[{i}].ranks", f"participant '{p.id}'", own))
    for where, who, layout in checks:
        if layout.world_size > max(train_episodes, 1):
            out.append(
                ConfigProblem(
                    path=f"{where}.processes_per_node",
                    message=f"{layout.world_size} ranks for {who} but only {train_episodes} "
                    "training episodes to shard among them; use at most "
                    f"{train_episodes} ranks or raise data.episodes.",
                )
            )
        if layout.backend == "nccl" and not cuda_image:
            out.append(
                ConfigProblem(
                    path=f"{where}.backend",
                    message=f"'nccl' for {who} needs a CUDA image, but deployment.image.tag "
                    f"'{cfg.deployment.image.tag}' names none; use a '-cuNNN' tag or backend "
                    "'gloo'.",
                )
            )
        if layout.backend == "nccl" and gpus < layout.processes_per_node:
            out.append(
                ConfigProblem(
                    path=f"{where}.processes_per_node",
                    message=f"{layout.processes_per_node} nccl ranks per node for {who} need "
                    "as many GPUs, but deployment.resources.participant.gpu is "
                    f"{gpus}; raise the gpu count or lower processes_per_node.",
                )
            )
        served = {
            "network.port": cfg.network.port,
            "network.health_port": cfg.network.health_port,
            "network.metrics_port": cfg.network.metrics_port,
            "network.download_port": cfg.network.download_port,
        }
        clash = [name for name, port in served.items() if port == layout.rendezvous_port]
        if layout.world_size > 1 and clash:
            out.append(
                ConfigProblem(
                    path=f"{where}.rendezvous_port",
                    message=f"{layout.rendezvous_port} for {who} is also {clash[0]}, and both "
                    "listen on the participant's host; choose another port (e.g. 29400).",
                )
            )
        batch = cfg.federation.inner_optimizer.batch_size
        if layout.world_size > 1 and batch % layout.world_size:
            out.append(
                ConfigProblem(
                    path=f"{where}.processes_per_node",
                    message=f"{layout.world_size} ranks for {who} cannot split "
                    f"federation.inner_optimizer.batch_size {batch} into equal shards; use a "
                    "rank count that divides the batch size.",
                )
            )
        if layout.world_size > 1 and cfg.model.target == "ema":
            out.append(
                ConfigProblem(
                    path=f"{where}.processes_per_node",
                    message=f"{layout.world_size} ranks for {who} with model.target 'ema': the "
                    "sharded inner loop keeps no EMA target yet; use model.target "
                    "'stop_gradient' or one rank.",
                )
            )
        if layout.mixed_precision == "bf16" and layout.backend != "nccl":
            out.append(
                ConfigProblem(
                    path=f"{where}.mixed_precision",
                    message=f"'bf16' for {who} is GPU mixed precision and needs backend "
                    "'nccl'; use 'none' on CPU (or model.dtype: bfloat16).",
                )
            )
    return out
