"""INV-RESIDENCY: a participant cannot send anything but a model-shaped pseudo-gradient."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from lensemble.errors import ResidencyViolation
from lensemble.federation import participant as participant_module
from lensemble.federation.payload import TensorSpec
from lensemble.federation.residency import ResidencyGuard
from tests.support.federation import build, small_config

ALLOWED = {"w": TensorSpec("w", (4, 3), torch.float32)}


def test_guard_accepts_exactly_the_model_shapes() -> None:
    guard = ResidencyGuard("alpha", ALLOWED)
    payload = guard.seal({"w": torch.zeros(4, 3)}, {"kind": "pseudo-gradient"})
    assert payload[:8]  # bytes were produced


@pytest.mark.parametrize(
    ("tensors", "metadata", "message"),
    [
        ({"w": torch.zeros(4, 3), "obs": torch.zeros(4, 3)}, {}, "'obs', which is not a model"),
        ({"w": torch.zeros(100, 3)}, {}, "as F32[100, 3]"),  # a data batch renamed 'w'
        ({"w": torch.zeros(4, 3, dtype=torch.float64)}, {}, "as F64[4, 3]"),
        ({}, {}, "lacks 'w'"),
        ({"w": torch.zeros(4, 3)}, {"episode": "1.0,2.0"}, "metadata 'episode'"),
        ({"w": torch.zeros(4, 3)}, {"round": "x" * 1000}, "metadata 'round'"),
    ],
)
def test_guard_refuses_everything_else(
    tensors: dict[str, torch.Tensor], metadata: dict[str, str], message: str
) -> None:
    guard = ResidencyGuard("alpha", ALLOWED)
    with pytest.raises(ResidencyViolation, match=re.escape(message)):
        guard.seal(tensors, metadata)


def test_smuggled_data_tensor_fails_closed_and_nothing_is_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = small_config()
    coordinator, transport, _ = build(config)
    real_quantize = participant_module.quantize
    observation_batch = torch.randn(64, 3)  # what a leaky participant would try to exfiltrate

    def leaky_quantize(delta: Any, scheme: str, chunk: int = 0) -> dict[str, torch.Tensor]:
        wire = real_quantize(delta, scheme, chunk)
        wire["data.observations"] = observation_batch
        return wire

    monkeypatch.setattr(participant_module, "quantize", leaky_quantize)
    with pytest.raises(ResidencyViolation, match="data.observations"):
        coordinator.run(transport)
    assert sum(transport.sent_by.values()) == 0
    assert transport.delivered == []
    assert coordinator.version == 0  # nothing committed


def test_renamed_data_batch_is_caught_by_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    config = small_config()
    coordinator, transport, _ = build(config)
    real_quantize = participant_module.quantize

    def renaming_quantize(delta: Any, scheme: str, chunk: int = 0) -> dict[str, torch.Tensor]:
        wire = real_quantize(delta, scheme, chunk)
        wire["encoder.weight"] = torch.randn(128, 2)  # data disguised as a parameter
        return wire

    monkeypatch.setattr(participant_module, "quantize", renaming_quantize)
    with pytest.raises(ResidencyViolation, match="encoder.weight"):
        coordinator.run(transport)
    assert transport.delivered == []


def test_guard_can_be_disabled_only_in_process() -> None:
    from lensemble.errors import ConfigError

    assert small_config().federation.transport != "network"
    guard = ResidencyGuard("alpha", ALLOWED, enforced=False)
    guard.check({"anything": torch.zeros(1)}, {})  # the simulation may opt out...
    with pytest.raises(ConfigError):  # ...but a network run may not
        from lensemble.config.load import validate_mapping

        validate_mapping(
            {
                "federation": {"transport": "network"},
                "data": {"residency_enforced": False},
                "network": {"auth": "insecure", "tls": {"enabled": False}},
            }
        )
