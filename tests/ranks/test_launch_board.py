"""The launch board: node 0 names each launch's rendezvous id, the other nodes read it there.

No ranks are started: a TCPStore on a loopback port stands between two boards in this process.
"""

from __future__ import annotations

import pytest
from torch.distributed import TCPStore

from lensemble.config.schema import RankLayout
from lensemble.errors import RankFailure
from lensemble.network.launch.launcher import free_port
from lensemble.ranks.launch import LaunchBoard, new_run_id, rendezvous_port


def _layout() -> RankLayout:
    return RankLayout(nodes=2, rendezvous_port=free_port())


def test_each_launch_has_a_new_id_the_follower_reads() -> None:
    layout = _layout()
    host = LaunchBoard.host(layout)
    follower = LaunchBoard.join(layout, timeout_s=10)
    first = host.announce("alpine")
    assert follower.next_launch(None, timeout_s=10) == first
    second = host.announce("alpine")
    assert second != first
    assert follower.next_launch(first, timeout_s=10) == second


def test_a_follower_waits_for_a_new_id_and_gives_up_with_a_clear_error() -> None:
    layout = _layout()
    host = LaunchBoard.host(layout)
    follower = LaunchBoard.join(layout, timeout_s=10)
    used = host.announce("alpine")
    with pytest.raises(RankFailure, match="started no launch"):
        follower.next_launch(used, timeout_s=0.5)


@pytest.mark.parametrize("planted", [b"x" * 100_000, b"\xff\xfe", b"lensemble-alpine"])
def test_a_planted_launch_id_is_refused_before_torch_sees_it(planted: bytes) -> None:
    """Anyone who reaches the port can write the key: only a well-formed id is used."""
    layout = _layout()
    host = LaunchBoard.host(layout)  # held: the board lives as long as node 0's learner
    follower = LaunchBoard.join(layout, timeout_s=10)
    intruder = TCPStore("127.0.0.1", layout.rendezvous_port, is_master=False)
    intruder.set("lensemble/next-launch", planted)
    with pytest.raises(RankFailure):
        follower.next_launch(None, timeout_s=2)
    assert host.announce("alpine") == follower.next_launch(None, timeout_s=10)


def test_joining_a_board_nobody_hosts_fails_fast() -> None:
    with pytest.raises(RankFailure, match="did not answer"):
        LaunchBoard.join(_layout(), timeout_s=1)


def test_launch_ids_never_repeat() -> None:
    assert len({new_run_id("alpine") for _ in range(100)}) == 100


def test_one_node_meets_on_a_free_port_and_several_on_the_configured_one() -> None:
    # Issue 41, item 1: every one-node group met on 29400, so the second on a host failed.
    assert rendezvous_port(RankLayout(processes_per_node=2)) == 0  # the store picks one
    assert rendezvous_port(RankLayout(nodes=2, rendezvous_port=29411)) == 29411
