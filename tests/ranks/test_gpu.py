"""Where CUDA exists: a 2-rank participant with nccl and bf16 mixed precision trains a round."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lensemble.config import load_config
from lensemble.data.trajectories import load_or_collect
from lensemble.model.inner_loop import WorldModelLearner, initial_global_parameters
from lensemble.network.launch.launcher import free_port
from lensemble.ranks.learner import RankGroupLearner
from tests.ranks.test_rank_group import CONFIG, SMALL

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(GPUS < 2, reason=f"needs 2 CUDA devices for 2 nccl ranks, found {GPUS}"),
]

#: bf16 compute keeps 8 bits of mantissa: after a round of a few AdamW steps the parameters are
#: within this of the fp32 single-process round (fp32 reduction and fp32 master parameters).
BF16_TOLERANCE = 5e-2


def test_nccl_bf16_round_tracks_the_fp32_round(tmp_path: Path) -> None:
    common = [
        *SMALL,
        f"run.output_dir={tmp_path}",
        f"federation.ranks.rendezvous_port={free_port()}",
    ]
    one = load_config(CONFIG, common)
    two = load_config(
        CONFIG,
        [
            *common,
            "deployment.image.tag=0.1.0-cu126",
            "deployment.resources.participant.gpu=2",
            "federation.participants[0].ranks.processes_per_node=2",
            "federation.participants[0].ranks.backend=nccl",
            "federation.participants[0].ranks.mixed_precision=bf16",
        ],
    )
    pid = one.participant_ids[0]
    data = load_or_collect(one, pid)
    theta = initial_global_parameters(one)
    reference = WorldModelLearner(one, pid, data).train_round(theta, 0, 4)
    group = RankGroupLearner(two, pid, data)
    try:
        sharded = group.train_round(theta, 0, 4)
    finally:
        group.close()
    assert all(sharded.params[n].dtype == torch.float32 for n in theta)
    assert all(torch.isfinite(sharded.params[n]).all() for n in theta)
    gap = max(float((sharded.params[n] - reference.params[n]).abs().max()) for n in theta)
    moved = max(float((sharded.params[n] - theta[n]).abs().max()) for n in theta)
    assert moved > 0 and gap < BF16_TOLERANCE
