"""Each participant's private data: shapes, split, determinism and the on-disk cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from lensemble.data import trajectories
from lensemble.data.trajectories import (
    DATA_FILE,
    RECORD_FILE,
    holdout_indices,
    load_or_collect,
)
from lensemble.errors import ConfigError
from tests.model.conftest import MakeConfig, small_config


def test_participant_data_shapes_dtypes_and_split(make_config: MakeConfig) -> None:
    config = make_config()
    pid = config.participant_ids[0]
    data = load_or_collect(config, pid)
    assert data.participant_id == pid
    assert data.train.obs.shape == (6, 41, 3) and data.holdout.obs.shape == (2, 41, 3)
    assert data.train.actions.shape == (6, 40, 1) and data.train.states.shape == (6, 41, 2)
    for t in (data.train.obs, data.train.actions, data.holdout.states):
        assert t.dtype == torch.float32
    assert data.cache_path == Path(config.run.output_dir) / "participants" / pid / "data"
    # Nothing but safetensors and JSON is written: nothing to unpickle, ever.
    assert sorted(p.name for p in data.cache_path.iterdir()) == [RECORD_FILE, DATA_FILE]


def test_holdout_is_a_deterministic_part_of_the_cached_episodes(make_config: MakeConfig) -> None:
    config = make_config()
    pid = config.participant_ids[0]
    data = load_or_collect(config, pid)
    held = holdout_indices(config, pid)
    assert held == holdout_indices(config, pid) and len(held) == round(8 * 0.25)
    everything = load_file(data.cache_path / DATA_FILE)
    train = [i for i in range(8) if i not in held]
    assert torch.equal(everything["obs"][held], data.holdout.obs)
    assert torch.equal(everything["obs"][train], data.train.obs)


def test_same_config_gives_identical_data_and_participants_differ(tmp_path: Path) -> None:
    a = small_config(tmp_path / "a")
    b = small_config(tmp_path / "b")
    first, second = a.participant_ids
    assert torch.equal(load_or_collect(a, first).train.obs, load_or_collect(b, first).train.obs)
    assert not torch.equal(
        load_or_collect(a, first).train.obs, load_or_collect(a, second).train.obs
    )


def test_second_call_reads_the_cache(
    make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config()
    pid = config.participant_ids[0]
    first = load_or_collect(config, pid)

    def no_collection(*args: object, **kwargs: object) -> None:
        raise AssertionError("collected again although the cache is valid")

    monkeypatch.setattr(trajectories, "collect", no_collection)
    second = load_or_collect(config, pid)
    assert torch.equal(first.train.obs, second.train.obs)
    assert torch.equal(first.holdout.actions, second.holdout.actions)


@pytest.mark.parametrize(
    ("change", "same_first_episode"),
    [
        ("federation.participants[0].env_params.g=13.0", False),
        ("run.root_seed=8", False),
        ("data.episodes=12", True),  # same seed: the first episodes repeat, more follow
    ],
)
def test_changed_collection_parameters_collect_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str, same_first_episode: bool
) -> None:
    config = small_config(tmp_path)
    pid = config.participant_ids[0]
    before = load_or_collect(config, pid)
    first_before = load_file(before.cache_path / DATA_FILE)["obs"][0]
    calls = []
    real_collect = trajectories.collect

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real_collect(*args, **kwargs)

    monkeypatch.setattr(trajectories, "collect", spy)
    changed = small_config(tmp_path, change)
    after = load_or_collect(changed, pid)
    assert len(calls) == 1 and after.cache_path == before.cache_path
    cached = load_file(after.cache_path / DATA_FILE)["obs"]
    assert cached.shape[0] == changed.data.episodes
    assert torch.equal(cached[0], first_before) == same_first_episode
    record = json.loads((after.cache_path / RECORD_FILE).read_text())
    assert record["root_seed"] == changed.run.root_seed
    assert record["episodes"] == changed.data.episodes
    assert record["env_params"] == changed.participant(pid).env_params


def test_corrupt_cache_is_collected_again(make_config: MakeConfig) -> None:
    config = make_config()
    pid = config.participant_ids[0]
    original = load_or_collect(config, pid)
    (original.cache_path / DATA_FILE).write_bytes(b"not a safetensors file")
    again = load_or_collect(config, pid)
    assert torch.equal(original.train.obs, again.train.obs)
    (original.cache_path / RECORD_FILE).write_text("{ truncated")
    assert torch.equal(original.train.obs, load_or_collect(config, pid).train.obs)


def test_bad_physics_key_names_the_participant(make_config: MakeConfig) -> None:
    config = make_config(
        "data.env_id=Acrobot-v1",
        "federation.participants[0].env_params={warp_drive: 1.0}",
        "federation.participants[1].env_params={}",
    )
    with pytest.raises(ConfigError) as err:
        load_or_collect(config, config.federation.participants[0].id)
    assert err.value.problems[0].path == "federation.participants[0].env_params.warp_drive"
