"""A participant as a group of 2 gloo ranks on CPU, end to end.

Every round launches the ranks with torch's elastic launcher (spawned interpreters), so these
tests take minutes on 2 shared cores: integration tier, ``slow``. What they hold:

- R = 2 with equal shards of the same global batch matches R = 1 after one round, within
  :data:`TOLERANCE` (the sums run in a different order, see the README's "Substrates");
- ``lensemble simulate`` with one 2-rank participant gives the same hash chain twice, and the
  same chain over the network transport (the real ``lensemble participant`` processes);
- a killed rank excludes that participant's round as ``rank_failure`` (over the network too:
  the participant abstains, and the chain equals the in-process one); it contributes again from
  the next round and the other participant is unaffected.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from lensemble.config import LensembleConfig, load_config
from lensemble.data.trajectories import load_or_collect
from lensemble.federation.faults import parse_faults
from lensemble.federation.ledger import committed_chain
from lensemble.model.inner_loop import WorldModelLearner, initial_global_parameters
from lensemble.network.launch.launcher import free_port
from lensemble.ranks.launch import ELASTIC_LOGGER, SPAWN_LOGGER
from lensemble.ranks.learner import RankGroupLearner
from lensemble.simulation.in_process import run_in_process
from lensemble.simulation.local_processes import run_local_processes
from lensemble.simulation.summary import SimulationResult

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config" / "local.yaml"

#: Largest absolute difference allowed between R = 1 and R = 2 parameters and AdamW moments
#: after one round: float32 sums in another order differ by a few ulps per step.
TOLERANCE = 1e-6

#: Two participants, short episodes, a small model, no baselines: alpine has 2 ranks.
SMALL = [
    "federation.participant_count=2",
    "federation.quorum=1",
    "federation.rounds=2",
    "federation.inner_steps=4",
    "federation.round_timeout_s=300",
    # Nodes that do not meet fail the round within minutes, not torch's default 15.
    "federation.join_timeout_s=300",
    "data.episodes=8",
    "data.episode_steps=40",
    "data.window=4",
    "evaluation.k_steps=3",
    "evaluation.local_only_baseline=false",
    "evaluation.pooled_oracle=false",
    "evaluation.fedavg_ablation=false",
    "model.hidden_dim=32",
    "model.latent_dim=8",
]
TWO_RANKS = "federation.participants[0].ranks.processes_per_node=2"
RANK_KILL = "rank_kill:alpine@1"


def _overrides(out: Path, *more: str) -> list[str]:
    return [
        *SMALL,
        *more,
        f"run.output_dir={out}",
        f"federation.ranks.rendezvous_port={free_port()}",
    ]


def _config(out: Path, *more: str) -> LensembleConfig:
    return load_config(CONFIG, _overrides(out, *more))


def test_two_ranks_match_one_rank_after_a_round(tmp_path: Path) -> None:
    one = _config(tmp_path)
    two = _config(tmp_path, TWO_RANKS)
    pid = one.participant_ids[0]
    data = load_or_collect(one, pid)
    theta = initial_global_parameters(one)
    single = WorldModelLearner(one, pid, data)
    group = RankGroupLearner(two, pid, data)
    try:
        r1 = single.train_round(theta, 0, 6)
        r2 = group.train_round(theta, 0, 6)
    finally:
        group.close()
    moved = max(float((r1.params[n] - theta[n]).abs().max()) for n in theta)
    assert moved > 100 * TOLERANCE  # the round did train: the comparison below can fail
    assert max(float((r1.params[n] - r2.params[n]).abs().max()) for n in theta) < TOLERANCE
    s1, s2 = single.inner_state(), group.inner_state()
    assert sorted(s1) == sorted(s2)
    assert all(torch.allclose(s1[k], s2[k], rtol=0, atol=TOLERANCE) for k in s1)
    assert r2.mean_loss == pytest.approx(r1.mean_loss, rel=1e-6)


@pytest.mark.parametrize("node0_sorts", ["first", "last"])
def test_two_nodes_match_one_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, node0_sorts: str
) -> None:
    """Node 1 is a real ``lensemble participant`` with ``LENSEMBLE_NODE_RANK=1`` (loopback).

    torch's c10d rendezvous orders the nodes by (host, pid): on one host the follower sorts
    first whenever its pid is lower (after a pid wrap). Both orders are forced here, through
    the pid in node 0's rendezvous descriptor, and rank 0 must still be node 0's.
    """
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

    generate = rdzv._NodeDescGenerator.generate
    sort_pid = 0 if node0_sorts == "first" else 2**31 - 1

    def placed(self: object, local_addr: str | None = None) -> object:
        desc = generate(self, local_addr)  # type: ignore[arg-type]
        return rdzv._NodeDesc(desc.addr, sort_pid, desc.local_id)

    monkeypatch.setattr(rdzv._NodeDescGenerator, "generate", placed)
    overrides = _overrides(
        tmp_path, "federation.participants[0].ranks.nodes=2", "federation.transport=network"
    )
    one, two = _config(tmp_path), load_config(CONFIG, overrides)
    pid = one.participant_ids[0]
    data = load_or_collect(one, pid)
    theta = initial_global_parameters(one)
    exe = shutil.which("lensemble")
    assert exe is not None
    sets = [arg for item in overrides for arg in ("--set", item)]
    log = tmp_path / "follower.log"  # a file, not a pipe nobody reads until the end
    with log.open("w") as errors:
        follower = subprocess.Popen(
            [exe, "participant", "--config", str(CONFIG), *sets, "--id", pid],
            env={
                **os.environ,
                "LENSEMBLE_NODE_RANK": "1",
                "LENSEMBLE_RENDEZVOUS_HOST": "127.0.0.1",
            },
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )
    group = RankGroupLearner(two, pid, data)
    try:
        sharded = group.train_round(theta, 0, 6)
    finally:
        try:
            group.close()  # node 0 ends the group: the follower exits
            follower.wait(timeout=300)
        finally:
            if follower.poll() is None:
                follower.kill()
                follower.wait()
    assert follower.returncode == 0, log.read_text()[-2000:]
    reference = WorldModelLearner(one, pid, data).train_round(theta, 0, 6)
    assert max(float((reference.params[n] - sharded.params[n]).abs().max()) for n in theta) < (
        TOLERANCE
    )


@pytest.fixture(scope="module")
def in_process_chain(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    config = _config(tmp_path_factory.mktemp("first"), TWO_RANKS)
    result = run_in_process(config)
    assert all(r.contributors == ["alpine", "coastal"] for r in result.records)
    return committed_chain(result.records)


def test_simulate_with_two_ranks_is_deterministic(
    in_process_chain: list[str], tmp_path: Path
) -> None:
    again = run_in_process(_config(tmp_path, TWO_RANKS))
    assert len(in_process_chain) == 2
    assert committed_chain(again.records) == in_process_chain


def test_network_transport_gives_the_in_process_chain(
    in_process_chain: list[str], tmp_path: Path, in_repo: Path
) -> None:
    overrides = _overrides(
        tmp_path,
        TWO_RANKS,
        "federation.transport=network",
    )
    config = load_config(CONFIG, overrides)
    result = run_local_processes(CONFIG, overrides, config, evaluate_final=False)
    assert committed_chain(result.records) == in_process_chain


def test_two_multi_rank_participants_on_one_host_over_the_network(
    tmp_path: Path, in_repo: Path
) -> None:
    """Issue 41, item 1: every rank group met on the default rendezvous port (29400).

    So the second multi-rank participant process on a host failed to host its rendezvous.
    Here both participants have 2 ranks, the config's rendezvous port is the default for both,
    and both must contribute to every round (quorum 2).
    """
    overrides = [
        *SMALL,
        f"run.output_dir={tmp_path}",
        "federation.ranks.processes_per_node=2",
        "federation.transport=network",
        "federation.quorum=2",
    ]
    config = load_config(CONFIG, overrides)
    layouts = [config.rank_layout(pid) for pid in config.participant_ids]
    assert [(lay.world_size, lay.rendezvous_port) for lay in layouts] == [(2, 29400)] * 2
    result = run_local_processes(CONFIG, overrides, config, evaluate_final=False)
    assert [(r.state, r.contributors) for r in result.records] == [
        ("closed", ["alpine", "coastal"])
    ] * 2


class _TorchReports(logging.Handler):
    """What torch's loggers that report a dead rank let through to their handlers."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


#: Records torch's elastic agent and spawn let through while a rank of the killed-rank run died.
_KILLED_RANK_TORCH_REPORTS: list[logging.LogRecord] = []


@pytest.fixture(scope="module")
def killed_rank_run(tmp_path_factory: pytest.TempPathFactory) -> SimulationResult:
    """Three rounds in process; a rank of alpine's 2-rank group kills itself in round 1."""
    config = _config(tmp_path_factory.mktemp("killed"), TWO_RANKS, "federation.rounds=3")
    seen = _TorchReports()
    loggers = [logging.getLogger(name) for name in (ELASTIC_LOGGER, SPAWN_LOGGER)]
    for logger in loggers:
        logger.addHandler(seen)
    try:
        return run_in_process(config, faults=parse_faults(RANK_KILL))
    finally:
        for logger in loggers:
            logger.removeHandler(seen)
        _KILLED_RANK_TORCH_REPORTS[:] = seen.records


def test_killed_rank_loses_that_round_only(killed_rank_run: SimulationResult) -> None:
    by_round = {r.round: r for r in killed_rank_run.records if r.state == "closed"}
    assert by_round[1].excluded == {"alpine": "rank_failure"}
    assert by_round[1].contributors == ["coastal"]
    assert by_round[0].contributors == by_round[2].contributors == ["alpine", "coastal"]
    # The dead rank is an expected, handled failure: torch's traceback of it is held back
    # (simulate prints one line of its own, cli.simulate_cmd.rank_failure_notes).
    reports = [f"{r.levelname} {r.getMessage()}" for r in _KILLED_RANK_TORCH_REPORTS]
    assert not [r for r in reports if r.startswith(("ERROR", "WARNING"))], reports


def test_killed_rank_over_the_network_gives_the_in_process_ledger(
    killed_rank_run: SimulationResult, tmp_path: Path, in_repo: Path
) -> None:
    """The real ``lensemble participant`` abstains with ``rank_failure``: the same chain."""
    overrides = _overrides(
        tmp_path, TWO_RANKS, "federation.rounds=3", "federation.transport=network"
    )
    config = load_config(CONFIG, overrides)
    result = run_local_processes(
        CONFIG, overrides, config, evaluate_final=False, faults=parse_faults(RANK_KILL)
    )
    closed = [r for r in result.records if r.state == "closed"]
    assert [r.excluded for r in closed] == [{}, {"alpine": "rank_failure"}, {}]
    assert committed_chain(result.records) == committed_chain(killed_rank_run.records)
