"""A small, fast world-model setup shared by the model, data and evaluation tests."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
import torch

from lensemble.config import load_config
from lensemble.config.schema import LensembleConfig

REPO = Path(__file__).resolve().parents[2]

#: Two participants from config/local.yaml (distinct Pendulum physics), short episodes.
SMALL = [
    "federation.participant_count=2",
    "federation.quorum=1",
    "data.episodes=8",
    "data.episode_steps=40",
    "data.window=4",
    "evaluation.k_steps=3",
    "model.hidden_dim=32",
    "model.latent_dim=8",
]

MakeConfig = Callable[..., LensembleConfig]


def small_config(output_dir: Path, *overrides: str) -> LensembleConfig:
    """``config/local.yaml`` shrunk by :data:`SMALL`, writing under ``output_dir``."""
    return load_config(
        REPO / "config" / "local.yaml", [*SMALL, *overrides, f"run.output_dir={output_dir}"]
    )


@pytest.fixture
def make_config(tmp_path: Path) -> MakeConfig:
    """Build a small config in this test's temporary folder, with extra ``--set`` overrides."""
    return lambda *overrides: small_config(tmp_path, *overrides)


def params_digest(params: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over sorted names, dtypes, shapes and raw bytes: equal digests mean equal bits."""
    h = hashlib.sha256()
    for name in sorted(params):
        t = params[name].detach().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
