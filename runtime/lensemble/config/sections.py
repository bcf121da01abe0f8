"""The config sections' shared base and constants, and the small sections.

The small sections are ``run``, ``model``, ``data``, ``observability`` and ``evaluation``; the
patterns and constants here are shared by every section and by the cross-field rules.

Pydantic v2, frozen, ``extra="forbid"``: an unknown key is an error, never silently ignored.
Every field carries a description with its unit so it shows in the exported JSON Schema.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

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


def cpu_cores(quantity: str) -> Decimal:
    """Cores of a Kubernetes CPU quantity (``K8S_CPU``): ``"500m"`` -> 0.5, ``"2"`` -> 2."""
    return Decimal(quantity[:-1]) / 1000 if quantity.endswith("m") else Decimal(quantity)


def unpinned_tag_refused(environment: str, tag: str) -> bool:
    """Whether ``environment`` refuses image ``tag``: ``latest`` is refused outside local.

    The one statement of the rule; the chart's values schema encodes the same two constants.
    """
    return tag == UNPINNED_TAG and environment != UNPINNED_TAG_ALLOWED_IN


MiB = 1024 * 1024
#: ``federation.aggregation`` values reserved for a later release (refused by the rules).
RESERVED_AGGREGATIONS = ("tee",)

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
