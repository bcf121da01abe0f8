"""single_threaded: one torch thread in every block, the count restored after the last."""

from __future__ import annotations

import threading

import torch

from lensemble.machinery.determinism import single_threaded


def test_the_thread_count_comes_back_only_after_the_last_block() -> None:
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        outer = single_threaded()
        outer.__enter__()
        with single_threaded():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1  # the outer block is still in
        outer.__exit__(None, None, None)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)


def test_blocks_on_several_threads_all_run_single_threaded() -> None:
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    inside: list[int] = []
    both_in = threading.Barrier(2)

    def block() -> None:
        with single_threaded():
            both_in.wait(timeout=30)  # both blocks are in at once
            inside.append(torch.get_num_threads())
            both_in.wait(timeout=30)  # neither leaves before the other has looked

    try:
        threads = [threading.Thread(target=block) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert inside == [1, 1]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)
