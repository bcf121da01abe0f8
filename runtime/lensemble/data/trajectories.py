"""A participant's private trajectories: collected once with its own physics, cached, split.

Each participant runs an exploration policy in its own environment (its ``env_params``) and keeps
the trajectories in its own output folder, ``<run.output_dir>/participants/<id>/data/``. Nothing
here leaves the participant, and nothing is ever pickled: the cache is one safetensors file plus
a small JSON record of the collection parameters and the file's SHA-256. A cache whose record
differs from what the config asks for (environment, physics, seed, episode count or length,
policy) or whose bytes do not match the recorded digest is collected again.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lensemble.data.envs import EnvSpec, env_spec, make_env, true_state
from lensemble.durable import atomic_write
from lensemble.errors import ConfigError, ConfigProblem
from lensemble.seeds import derive

if TYPE_CHECKING:
    import torch

    from lensemble.config.schema import LensembleConfig

#: Version of the cache layout and of the exploration policy; bump to invalidate old caches.
CACHE_FORMAT = "lensemble-trajectories-v1"
POLICY = "ar1-torque-v1"
DATA_FILE = "trajectories.safetensors"
RECORD_FILE = "collection.json"

# Exploration policy. Continuous actions follow an AR(1) process in normalised units: a
# temporally correlated torque pumps energy into a pendulum and covers its state space (swings
# and full rotations) far better than i.i.d. noise, whose effect averages out within a few steps.
_AR_CORRELATION = 0.9
_AR_SIGMA = 1.0
# Discrete actions repeat the previous one with this probability, else draw uniformly.
_STICKY = 0.5
# Environments outside the built-in ones may terminate; a segment that does is dropped and
# collected again from a fresh reset, at most this many times per episode.
_MAX_ATTEMPTS = 100


@dataclass(frozen=True)
class Trajectories:
    """Fixed-length episodes of one participant.

    Attributes:
        obs: float32 ``[E, T+1, obs_dim]``: observations, including the one after the last step.
        actions: float32 ``[E, T, action_dim]``: actions in environment units (one-hot for
            discrete action spaces).
        states: float32 ``[E, T+1, state_dim]``: the true physical state behind each
            observation (for the linear probe).
    """

    obs: torch.Tensor
    actions: torch.Tensor
    states: torch.Tensor

    @property
    def episodes(self) -> int:
        """Number of episodes ``E``."""
        return int(self.obs.shape[0])

    @property
    def steps(self) -> int:
        """Steps per episode ``T``."""
        return int(self.actions.shape[1])

    def select(self, index: list[int]) -> Trajectories:
        """The episodes at ``index`` (in that order)."""
        return Trajectories(self.obs[index], self.actions[index], self.states[index])


@dataclass(frozen=True)
class ParticipantData:
    """Everything a participant trains and evaluates on; it never leaves the participant.

    Attributes:
        participant_id: The participant's id.
        train: Training episodes.
        holdout: Held-out episodes, ``round(episodes * holdout_fraction)`` of them.
        spec: The environment's shapes and scales.
        cache_path: Folder of the cached trajectories.
    """

    participant_id: str
    train: Trajectories
    holdout: Trajectories
    spec: EnvSpec
    cache_path: Path


def data_dir(config: LensembleConfig, participant_id: str) -> Path:
    """``<run.output_dir>/participants/<id>/data``: where a participant's data is cached."""
    return Path(config.run.output_dir) / "participants" / participant_id / "data"


def _collection_record(config: LensembleConfig, participant_id: str) -> dict[str, Any]:
    """What determines the collected bytes; the cache is valid only for an equal record."""
    spec = config.participant(participant_id)
    return {
        "format": CACHE_FORMAT,
        "policy": POLICY,
        "participant_id": participant_id,
        "env_id": config.data.env_id,
        "env_params": {k: float(v) for k, v in sorted(spec.env_params.items())},
        "root_seed": config.run.root_seed,
        "episodes": config.data.episodes,
        "episode_steps": config.data.episode_steps,
    }


def _policy_step(
    rng: np.random.Generator, spec: EnvSpec, previous: np.ndarray | int
) -> np.ndarray | int:
    """Next exploration action: AR(1) in [-1, 1] units, or a sticky uniform discrete action."""
    if spec.discrete:
        if rng.random() < _STICKY:
            return previous
        return int(rng.integers(spec.n_actions))
    assert isinstance(previous, np.ndarray)
    noise = rng.normal(0.0, _AR_SIGMA, size=spec.action_dim)
    return np.asarray(
        _AR_CORRELATION * previous + math.sqrt(1 - _AR_CORRELATION**2) * noise, dtype=np.float64
    )


def _to_env_action(spec: EnvSpec, latent: np.ndarray | int) -> tuple[Any, np.ndarray]:
    """The action the environment takes and the vector the model sees (one-hot if discrete)."""
    if spec.discrete:
        assert isinstance(latent, int)
        onehot = np.zeros(spec.n_actions, dtype=np.float32)
        onehot[latent] = 1.0
        return latent, onehot
    assert isinstance(latent, np.ndarray)
    low, high = np.asarray(spec.action_low), np.asarray(spec.action_high)
    unit = np.clip(latent, -1.0, 1.0)
    action = ((low + high) / 2 + unit * (high - low) / 2).astype(np.float32)
    return action, action


def collect(
    env_id: str,
    env_params: dict[str, float],
    *,
    seed: int,
    episodes: int,
    steps: int,
    spec: EnvSpec | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run the exploration policy for ``episodes`` fixed-length episodes.

    Args:
        env_id: ``data.env_id``.
        env_params: The participant's physics overrides.
        seed: Seed of the policy and of every episode's reset (63-bit integer).
        episodes: Episodes ``E`` (count).
        steps: Steps per episode ``T`` (count).
        spec: The environment's spec, if already known.

    Returns:
        float32 arrays ``obs [E, T+1, obs_dim]``, ``actions [E, T, action_dim]`` and
        ``states [E, T+1, state_dim]``.

    Raises:
        ConfigError: The environment keeps terminating before ``steps`` steps.
    """
    spec = spec or env_spec(env_id)
    rng = np.random.default_rng(seed)
    obs = np.zeros((episodes, steps + 1, spec.obs_dim), dtype=np.float32)
    actions = np.zeros((episodes, steps, spec.action_dim), dtype=np.float32)
    states = np.zeros((episodes, steps + 1, spec.state_dim), dtype=np.float32)
    env = make_env(env_id, env_params)
    try:
        for e in range(episodes):
            for _attempt in range(_MAX_ATTEMPTS):
                if _collect_episode(
                    env, spec, rng, obs=obs[e], actions=actions[e], states=states[e]
                ):
                    break
            else:
                raise ConfigError(
                    [
                        ConfigProblem(
                            path="data.episode_steps",
                            message=f"{steps} steps: {env_id} terminated earlier in "
                            f"{_MAX_ATTEMPTS} attempts in a row; lower data.episode_steps.",
                        )
                    ]
                )
    finally:
        env.close()
    return obs, actions, states


def _collect_episode(
    env: Any,
    spec: EnvSpec,
    rng: np.random.Generator,
    *,
    obs: np.ndarray,
    actions: np.ndarray,
    states: np.ndarray,
) -> bool:
    """Fill one episode in place; False when the environment terminated early."""
    o, _ = env.reset(seed=int(rng.integers(2**31)))
    obs[0], states[0] = o, true_state(env, spec.family, o)
    latent: np.ndarray | int
    if spec.discrete:
        latent = int(rng.integers(spec.n_actions))
    else:
        latent = rng.normal(0.0, _AR_SIGMA, size=spec.action_dim)
    for t in range(actions.shape[0]):
        env_action, model_action = _to_env_action(spec, latent)
        o, _reward, terminated, _truncated, _info = env.step(env_action)
        if terminated:
            return False
        actions[t], obs[t + 1] = model_action, o
        states[t + 1] = true_state(env, spec.family, o)
        latent = _policy_step(rng, spec, latent)
    return True


def holdout_indices(config: LensembleConfig, participant_id: str) -> list[int]:
    """Which episodes are held out: ``round(episodes * holdout_fraction)``, chosen by seed.

    Returns:
        Sorted episode indices, drawn from a permutation seeded by
        ``derive(root_seed, f"holdout:{participant_id}")``.
    """
    episodes = config.data.episodes
    held = round(episodes * config.data.holdout_fraction)
    rng = np.random.default_rng(derive(config.run.root_seed, f"holdout:{participant_id}"))
    return sorted(int(i) for i in rng.permutation(episodes)[:held])


def _atomic_write(path: Path, payload: bytes) -> None:
    """Write ``payload`` to ``path`` so a reader sees the old file or the new one, never half.

    Durable (folder fsync'd) and a full disk is one sentence (:mod:`lensemble.durable`).
    """
    atomic_write(path, payload)


def _read_cache(folder: Path, record: dict[str, Any]) -> dict[str, torch.Tensor] | None:
    """The cached tensors if the record matches and the bytes match their digest, else None."""
    from safetensors.torch import load

    try:
        stored = json.loads((folder / RECORD_FILE).read_text())
        payload = (folder / DATA_FILE).read_bytes()
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or stored.get("sha256") != hashlib.sha256(payload).hexdigest():
        return None
    if {k: v for k, v in stored.items() if k != "sha256"} != record:
        return None
    try:
        tensors = load(payload)
    except Exception:  # a corrupt cache is collected again, never trusted
        return None
    if set(tensors) != {"obs", "actions", "states"}:
        return None
    return tensors


def load_or_collect(config: LensembleConfig, participant_id: str) -> ParticipantData:
    """A participant's data: read from its cache, or collected with its own physics and cached.

    Collection uses an exploration policy seeded by ``derive(root_seed, f"data:{id}")``:
    ``data.episodes`` episodes of ``data.episode_steps`` steps with the participant's
    ``env_params``. The cache (``<run.output_dir>/participants/<id>/data/``) is written
    atomically (temporary file, then ``os.replace``); the JSON record is written last, so a
    crash leaves either the old cache or none.

    Args:
        config: The run's config.
        participant_id: One of ``config.participant_ids``.

    Returns:
        The participant's train and held-out episodes.

    Raises:
        KeyError: No participant has that id.
        ConfigError: The environment or a physics override is unusable.
        ToolMissing: A ``swm/`` environment was asked for without the vendored shim.
    """
    import torch
    from safetensors.torch import save

    index = [p.id for p in config.federation.participants].index(participant_id)
    env_id = config.data.env_id
    folder = data_dir(config, participant_id)
    record = _collection_record(config, participant_id)
    try:
        spec = env_spec(env_id)
        tensors = _read_cache(folder, record)
        if tensors is None:
            params = dict(config.federation.participants[index].env_params)
            seed = derive(config.run.root_seed, f"data:{participant_id}")
            obs, actions, states = collect(
                env_id,
                params,
                seed=seed,
                episodes=config.data.episodes,
                steps=config.data.episode_steps,
                spec=spec,
            )
            tensors = {
                "obs": torch.from_numpy(obs),
                "actions": torch.from_numpy(actions),
                "states": torch.from_numpy(states),
            }
            payload = save(tensors, metadata={"format": CACHE_FORMAT})
            folder.mkdir(parents=True, exist_ok=True)
            _atomic_write(folder / DATA_FILE, payload)
            digest = hashlib.sha256(payload).hexdigest()
            text = json.dumps({**record, "sha256": digest}, indent=2, sort_keys=True) + "\n"
            _atomic_write(folder / RECORD_FILE, text.encode())
    except ConfigError as exc:
        # Point env_params problems at this participant's entry in the config.
        prefix = f"federation.participants[{index}]."
        raise ConfigError(
            [
                ConfigProblem(
                    path=prefix + p.path if p.path.startswith("env_params") else p.path,
                    message=p.message,
                )
                for p in exc.problems
            ]
        ) from exc
    everything = Trajectories(tensors["obs"], tensors["actions"], tensors["states"])
    held = holdout_indices(config, participant_id)
    train = [i for i in range(everything.episodes) if i not in set(held)]
    return ParticipantData(
        participant_id=participant_id,
        train=everything.select(train),
        holdout=everything.select(held),
        spec=spec,
        cache_path=folder,
    )
