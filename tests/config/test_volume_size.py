"""The coordinator's volume is sized from the model and the checkpoints kept, or overridden."""

from __future__ import annotations

from pathlib import Path

from lensemble.config.load import load_config, validate_mapping
from lensemble.config.sizing import CHECKPOINTS_KEPT, coordinator_state_bytes, spool_bytes
from lensemble.render.helm_values import render_helm_values

STAGING = Path(__file__).resolve().parents[2] / "config" / "staging.yaml"


def _size(*overrides: str) -> str:
    config = load_config(STAGING, overrides)
    return str(render_helm_values(config)["persistence"]["coordinator"]["size"])


def test_a_large_model_gets_a_volume_for_every_checkpoint_kept() -> None:
    # Issue 15: hidden 4096 x depth 4 needs about 3.2 GB of checkpoints; the fixed 1Gi failed.
    big = validate_mapping({"model": {"hidden_dim": 4096, "depth": 4}})
    assert coordinator_state_bytes(big) > 3.2e9
    # Issue 36: one more checkpoint, the divergence guard's best model, kept whatever its age.
    assert _size("model.hidden_dim=4096", "model.depth=4") == "5Gi"
    assert _size() == "1Gi"  # the default model is tiny


def test_the_size_grows_with_the_checkpoints_kept() -> None:
    config = validate_mapping({"model": {"hidden_dim": 2048, "depth": 3}})
    per_checkpoint = coordinator_state_bytes(config) / (CHECKPOINTS_KEPT + 1)
    assert per_checkpoint > 2 * 4 * 2048 * 2048 * 2  # parameters and momentum, float32


def test_an_override_wins() -> None:
    assert _size("model.hidden_dim=4096", "deployment.storage.coordinator_size=20Gi") == "20Gi"


def test_the_volume_holds_one_spilled_update_per_participant() -> None:
    def sized(quantization: str, n: int) -> tuple[int, int]:
        config = validate_mapping(
            {
                "model": {"hidden_dim": 1024, "depth": 2},
                "federation": {"participant_count": n, "quantization": quantization},
            }
        )
        return spool_bytes(config), coordinator_state_bytes(config)

    fp32, total = sized("none", 8)
    assert fp32 > 8 * 4 * 1024 * 1024  # eight float32 updates of the hidden layer alone
    assert sized("none", 16)[0] > 1.9 * fp32
    assert sized("int8", 8)[0] < fp32 / 3
    assert total - fp32 == sized("none", 4)[1] - sized("none", 4)[0]  # checkpoints unchanged
