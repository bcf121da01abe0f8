"""The residency guard (docs/concepts.md#residency): the only way bytes leave a participant.

A participant's outgoing payload is sealed by :meth:`ResidencyGuard.seal`, which refuses, before
any byte is produced, anything that is not a pseudo-gradient of the global model's exact
architecture in the configured wire format: an unknown tensor name, a known name with another
shape or dtype (a data batch renamed after a parameter), or metadata outside a small allow-list.
It raises :class:`~lensemble.errors.ResidencyViolation` and never retries: the run fails closed.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from lensemble.errors import ResidencyViolation
from lensemble.federation.payload import TensorSpec, dtype_token, encode

#: Metadata keys a pseudo-gradient payload may carry; values are short scalars as strings.
ALLOWED_METADATA = frozenset(
    {
        "kind",
        "round",
        "attempt",
        "participant",
        "base_hash",
        "quantization",
        "int8_chunk",
        "mean_loss",
        "compute_s",
        "heldout_loss",
        "privacy_epsilon",
    }
)
MAX_METADATA_VALUE = 128


class ResidencyGuard:
    """Fail-closed egress check for one participant.

    Args:
        participant_id: The participant whose trust domain the guard protects.
        allowed: Exactly the tensors a payload may carry (``quantization.wire_specs``).
        enforced: ``data.residency_enforced``; only the in-process simulation may turn it off.
    """

    def __init__(
        self, participant_id: str, allowed: Mapping[str, TensorSpec], *, enforced: bool = True
    ) -> None:
        self.participant_id = participant_id
        self.allowed = dict(allowed)
        self.enforced = enforced

    def check(self, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> None:
        """Raise unless every tensor and metadata entry may leave the trust domain.

        Raises:
            ResidencyViolation: Naming the offending tensor or metadata key (never its values).
        """
        if not self.enforced:
            return
        where = f"participant '{self.participant_id}'"
        fix = (
            "only model-shaped pseudo-gradients may leave a trust domain; this is a bug or an "
            "attack."
        )
        for name, t in tensors.items():
            spec = self.allowed.get(name)
            if spec is None:
                raise ResidencyViolation(
                    f"{where} tried to send tensor '{name}', which is not a model parameter;",
                    remediation=fix,
                )
            if tuple(t.shape) != spec.shape or t.dtype != spec.dtype:
                raise ResidencyViolation(
                    f"{where} tried to send '{name}' as {dtype_token(t.dtype)}{list(t.shape)}; "
                    f"the parameter is {dtype_token(spec.dtype)}{list(spec.shape)};",
                    remediation=fix,
                )
        missing = set(self.allowed) - set(tensors)
        if missing:
            raise ResidencyViolation(
                f"{where} payload lacks '{sorted(missing)[0]}'; a partial payload is refused;",
                remediation=fix,
            )
        for key, value in metadata.items():
            if key not in ALLOWED_METADATA or len(str(value)) > MAX_METADATA_VALUE:
                raise ResidencyViolation(
                    f"{where} tried to send metadata '{key}', which is not allowed;",
                    remediation=fix,
                )

    def seal(self, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> bytes:
        """Check, then serialize: the only constructor of outgoing payload bytes.

        Raises:
            ResidencyViolation: As :meth:`check`; no bytes are produced.
        """
        self.check(tensors, metadata)
        return encode(tensors, metadata)
