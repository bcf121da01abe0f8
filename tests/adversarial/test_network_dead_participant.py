"""Issue 12.4: a dead participant must not stall rounds (real processes, SIGKILL).

``federation.round_timeout_s`` is 60 s, far above a normal round (milliseconds with the
quadratic learner, seconds on a loaded machine), so "the round did not wait for the timeout" is
a robust assertion: every round must close in well under half of it. On main, each round after
the kill waited the full 60 s for the dead participant, and so did the round it rejoined in.
"""

from __future__ import annotations

import signal
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.network import federation, ledger, network_mapping, write_config

pytestmark = pytest.mark.slow
START_S = 90.0  # process start-up on a loaded 2-core machine (torch import)
ROUND_TIMEOUT_S = 60.0


def _is(name: str, **fields: Any) -> Any:
    return lambda e: e.get("event") == name and all(e.get(k) == v for k, v in fields.items())


def _wait_for(path: Path, timeout_s: float = START_S) -> None:
    end = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.05)


def test_rounds_after_a_sigkill_and_the_rejoin_do_not_wait_for_the_dead(tmp_path: Path) -> None:
    # No straggler cutoff: only the disconnection may close round 2 without charlie (on a
    # loaded machine the cutoff could close it first, as 'straggler').
    mapping = network_mapping(
        tmp_path,
        rounds=6,
        round_timeout_s=ROUND_TIMEOUT_S,
        join_timeout_s=120,
        straggler_factor=None,
    )
    path, config = write_config(tmp_path, mapping)
    markers = tmp_path / "markers"
    markers.mkdir()
    with federation(tmp_path, path) as fed:
        coordinator = fed.start_coordinator()
        # alpha parks in its training of round 4, so the rejoin happens while a round is open.
        alpha = fed.start_participant("alpha", extra_args=_held(markers, 4))
        others = [fed.start_participant(pid) for pid in ("bravo", "delta")]
        # charlie parks inside its training of round 2 (rounds 0 and 1 are normal rounds).
        victim = fed.start_participant("charlie", extra_args=_held(markers, 2))
        _wait_for(markers / "charlie-r2.blocked")
        for pid in ("alpha", "bravo", "delta"):
            coordinator.wait_event(_is("verdict", round=2, participant=pid), START_S)
        killed_at = time.monotonic()
        victim.popen.kill()  # mid-round, with no call of its own in flight
        assert victim.wait(10) == -signal.SIGKILL
        coordinator.wait_event(_is("round_closed", round=2), START_S)
        death_to_close_s = time.monotonic() - killed_at
        # Round 3 runs without charlie; in round 4 alpha is held, then charlie comes back.
        _wait_for(markers / "alpha-r4.blocked")
        restarted = fed.start_participant("charlie")
        coordinator.wait_event(_is("joined", participant="charlie", rejoin=True), START_S)
        released_at = time.monotonic()
        (markers / "alpha-r4.release").touch()
        coordinator.wait_event(_is("round_closed", round=4), START_S)
        release_to_close_s = time.monotonic() - released_at
        assert coordinator.wait(START_S) == 0
        assert [p.wait(30) for p in (alpha, *others, restarted)] == [0, 0, 0, 0]
    records = ledger(config)
    assert [r.state for r in records] == ["closed"] * 6
    walls = {r.round: r.wall_s for r in records}
    normal = statistics.median([walls[0], walls[1]])
    print(
        f"round walls (s): {walls}; normal round {normal:.3f} s; round after the death "
        f"{walls[3]:.3f} s ({walls[3] / normal:.1f}x); SIGKILL -> round 2 closed "
        f"{death_to_close_s:.2f} s; release -> round 4 (rejoin round) closed "
        f"{release_to_close_s:.2f} s; round_timeout_s {ROUND_TIMEOUT_S:.0f} s"
    )
    # No round waited for the dead participant: not the round of the kill, not the round after
    # it, not the round it rejoined in (each well under half the 60 s timeout).
    assert death_to_close_s < ROUND_TIMEOUT_S / 2
    assert walls[3] < ROUND_TIMEOUT_S / 2
    assert release_to_close_s < ROUND_TIMEOUT_S / 2
    assert [r.contributors for r in records[2:5]] == [["alpha", "bravo", "delta"]] * 3
    assert records[2].excluded == records[3].excluded == {"charlie": "disconnected"}
    assert records[4].excluded == {"charlie": "disconnected"}
    # Counted from the opening after its rejoin.
    assert records[5].contributors == ["alpha", "bravo", "charlie", "delta"]


def _held(markers: Path, round_index: int) -> list[str]:
    return ["--block-round", str(round_index), "--markers", str(markers)]
