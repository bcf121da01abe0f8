"""Disk the coordinator needs, from the model size and checkpoint retention.

A coordinator checkpoint holds the float32 parameters and the outer momentum (two copies of
the model). :data:`CHECKPOINTS_KEPT` are kept, the divergence guard keeps its best model's
beside them (:data:`CHECKPOINTS_PINNED`; one more under ``federation.final_model:
best_reported``, the best reported version), and one more is being written while the oldest is
still there, so the state folder needs ``(CHECKPOINTS_KEPT + CHECKPOINTS_PINNED + 1) * 2 *
model bytes`` plus the ledger and headroom, plus the update spool: while a round is collected,
every accepted update waits on disk in its wire format (:mod:`lensemble.federation.spool`), one
per participant. The environment's observation and action sizes are not known without creating
it;
:data:`IO_DIM_BOUND` bounds them (they are small next to the hidden layers).
"""

from __future__ import annotations

import itertools
import math

from lensemble.config.schema import LensembleConfig

#: Coordinator checkpoints kept on disk (``lensemble.federation.checkpoint.KEEP``).
CHECKPOINTS_KEPT = 3
#: Older checkpoints kept as well: the divergence guard's best model
#: (``lensemble.federation.checkpoint.CheckpointStore.pinned``).
CHECKPOINTS_PINNED = 1

#: Upper bound assumed for an environment's observation and action sizes (count).
IO_DIM_BOUND = 64

#: Room for the ledger, metrics and filesystem overhead (bytes).
STATE_HEADROOM_BYTES = 256 * 2**20

#: Bytes per parameter of a pseudo-gradient on the wire, by ``federation.quantization``.
WIRE_BYTES_PER_PARAMETER = {"none": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0}
#: Allowance for one update's safetensors header and int8 scales (bytes).
UPDATE_OVERHEAD_BYTES = 2**20


def _mlp_parameters(in_dim: int, hidden: int, depth: int, out_dim: int) -> int:
    widths = [in_dim, *([hidden] * depth), out_dim]
    return sum(a * b + b for a, b in itertools.pairwise(widths))


def model_parameters(config: LensembleConfig) -> int:
    """Upper bound on the world model's parameter count (encoder + predictor; count)."""
    m = config.model
    encoder = _mlp_parameters(IO_DIM_BOUND, m.hidden_dim, m.depth, m.latent_dim)
    predictor = _mlp_parameters(m.latent_dim + IO_DIM_BOUND, m.hidden_dim, m.depth, m.latent_dim)
    return encoder + predictor


def coordinator_state_bytes(config: LensembleConfig) -> int:
    """Bytes the coordinator's state folder needs (checkpoints, ledger, headroom)."""
    checkpoint = 2 * 4 * model_parameters(config)  # float32 parameters + momentum
    # The best reported version a run ends with is pinned too (federation.final_model).
    pinned = CHECKPOINTS_PINNED + (config.federation.final_model == "best_reported")
    kept = CHECKPOINTS_KEPT + pinned + 1  # + the one being written
    return kept * checkpoint + spool_bytes(config) + STATE_HEADROOM_BYTES


def spool_bytes(config: LensembleConfig) -> int:
    """Bytes the update spool needs at most: one wire-format update per participant.

    int8 carries one float32 scale per ``int8_chunk`` elements (per tensor without chunks),
    which the per-update allowance covers for chunks of 4 elements or more.
    """
    fed = config.federation
    per_update = WIRE_BYTES_PER_PARAMETER[fed.quantization] * model_parameters(config)
    if fed.quantization == "int8" and fed.int8_chunk:
        per_update += 4 * model_parameters(config) / fed.int8_chunk
    return len(fed.participants) * math.ceil(per_update + UPDATE_OVERHEAD_BYTES)


def coordinator_volume_size(config: LensembleConfig) -> str:
    """The coordinator volume as a Kubernetes quantity: the override, else derived (``NGi``).

    ``deployment.storage.coordinator_size`` wins when set; otherwise
    :func:`coordinator_state_bytes` rounded up to whole GiB (at least ``1Gi``).
    """
    override = config.deployment.storage.coordinator_size
    if override:
        return override
    return f"{max(1, math.ceil(coordinator_state_bytes(config) / 2**30))}Gi"
