"""How many bytes one payload stream may carry: derived from the model, lowered by the config.

A payload is a safetensors file: an 8-byte length, a JSON header (tensor names, shapes, offsets
and a few metadata strings), then the tensor bytes. The tensor bytes are known exactly from the
architecture and the wire dtype; the header is bounded by :data:`HEADER_ROOM` plus a
per-tensor allowance. The cap of a stream is that bound, or ``network.max_message_bytes`` when
the config sets a lower one: a config can shrink what a peer may send, never grow it past what
an honest peer could need, so a hostile peer costs at most about one model of memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lensemble.config import LensembleConfig
from lensemble.errors import ConfigError, ConfigProblem
from lensemble.federation.payload import TensorSpec
from lensemble.federation.quantization import wire_specs

#: Header allowance (bytes) for the length prefix, metadata strings and JSON framing.
HEADER_ROOM = 64 * 1024
#: Header allowance (bytes) per tensor on top of its name: dtype, shape, offsets.
PER_TENSOR_ROOM = 256


def _tensor_bytes(specs: Mapping[str, TensorSpec]) -> int:
    total = 0
    for spec in specs.values():
        numel = 1
        for d in spec.shape:
            numel *= d
        total += numel * spec.dtype.itemsize
    return total


def wire_bytes(specs: Mapping[str, TensorSpec]) -> int:
    """Upper bound (bytes) of a payload carrying exactly ``specs``: tensor bytes plus header."""
    header = HEADER_ROOM + sum(PER_TENSOR_ROOM + len(name.encode()) for name in specs)
    return _tensor_bytes(specs) + header


@dataclass(frozen=True)
class PayloadLimits:
    """The byte caps of the two payload streams of a run.

    Attributes:
        model_bytes: Largest global-model payload (float32 parameters) a participant accepts.
        update_bytes: Largest pseudo-gradient payload (in ``federation.quantization``) the
            coordinator accepts.
        needed_bytes: What an honest run needs in both directions (the larger derived bound).
        configured: ``network.max_message_bytes``, or None when unset.
    """

    model_bytes: int
    update_bytes: int
    needed_bytes: int
    configured: int | None


def payload_limits(
    config: LensembleConfig, architecture: Mapping[str, TensorSpec]
) -> PayloadLimits:
    """The caps of a run whose global model has ``architecture`` (name -> float32 spec).

    Raises:
        ConfigError: ``network.max_message_bytes`` is below what a model or update payload of
            this architecture needs: the run could never complete a round.
    """
    fed = config.federation
    model = wire_bytes(wire_specs(architecture, "none"))
    update = wire_bytes(wire_specs(architecture, fed.quantization, fed.int8_chunk))
    needed = max(model, update)
    configured = config.network.max_message_bytes
    if configured is not None and configured < needed:
        raise ConfigError(
            [
                ConfigProblem(
                    "network.max_message_bytes",
                    f"{configured} bytes is below the {needed} bytes a "
                    f"payload of this model needs (its wire size with federation.quantization "
                    f"'{fed.quantization}' plus header room), so no round could ever complete; "
                    "unset it "
                    f"(the cap is then derived from the model) or set at least {needed}.",
                )
            ]
        )
    if configured is None:
        return PayloadLimits(model, update, needed, None)
    return PayloadLimits(min(configured, model), min(configured, update), needed, configured)
