"""The smallest world-model run the simulation tests train: a few short episodes, a tiny model.

Config overrides (``--set`` form) shared by the tests that run whole simulations; each adds its
own federation size and rounds.
"""

from __future__ import annotations

#: Data, evaluation and model settings small enough for a test to train in seconds.
SMALL_WORLD_MODEL = [
    "data.episodes=6",
    "data.episode_steps=30",
    "data.window=3",
    "evaluation.k_steps=2",
    "model.hidden_dim=16",
    "model.latent_dim=4",
]
