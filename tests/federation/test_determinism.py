"""INV-AGG-DETERMINISM: the hash chain depends only on config, seed and contributor sets."""

from __future__ import annotations

import functools

from hypothesis import given, settings
from hypothesis import strategies as st

from lensemble.federation.faults import parse_faults
from lensemble.federation.ledger import committed_chain
from tests.support.federation import build, small_config

IDS = ["alpha", "bravo", "charlie", "delta"]


def _chain(faults: str = "", **federation: object) -> tuple[list[str], list[list[str]]]:
    coordinator, transport, _ = build(small_config(**federation), faults=parse_faults(faults))
    records = coordinator.run(transport).records
    committed = [r for r in records if r.state == "closed"]
    return committed_chain(records), [r.contributors for r in committed]


@functools.cache
def _fault_free_chain() -> tuple[list[str], list[list[str]]]:
    """The chain without faults, computed once for every example that compares against it."""
    return _chain()


def test_same_config_and_seed_give_identical_chains() -> None:
    assert _chain() == _chain()


def test_different_seed_gives_a_different_chain() -> None:
    from lensemble.config.load import validate_mapping
    from lensemble.federation.coordinator import Coordinator
    from tests.support.federation import initial_params

    a = Coordinator(small_config(), initial_params(3)).model_hash
    b = Coordinator(validate_mapping({"run": {"root_seed": 4}}), initial_params(4)).model_hash
    assert a != b


@settings(max_examples=30, deadline=None)
@given(
    arrivals=st.lists(
        st.lists(st.floats(min_value=0.1, max_value=29.0), min_size=4, max_size=4),
        min_size=3,
        max_size=3,
    ),
    duplicates=st.lists(st.tuples(st.sampled_from(IDS), st.integers(0, 2)), max_size=4),
)
def test_arrival_order_and_duplicates_never_change_the_hashes(
    arrivals: list[list[float]], duplicates: list[tuple[str, int]]
) -> None:
    reference = _fault_free_chain()
    faults = [
        f"delay:{pid}@{t}={seconds:.3f}"
        for t, row in enumerate(arrivals)
        for pid, seconds in zip(IDS, row, strict=True)
    ]
    faults += [f"duplicate:{pid}@{t}" for pid, t in set(duplicates)]
    # Arrivals anywhere before the deadline: without a straggler cutoff, none is excluded.
    assert _chain(",".join(faults), straggler_factor=None) == reference


@settings(max_examples=10, deadline=None)
@given(
    straggler=st.sampled_from(IDS),
    round_index=st.integers(1, 2),
    seconds=st.floats(min_value=10.5, max_value=18.5),
)
def test_a_straggler_changes_the_hash_only_through_the_contributor_set(
    straggler: str, round_index: int, seconds: float
) -> None:
    # Rounds collect in about 1 virtual second, so the straggler cutoff is its 10 s minimum:
    # an update arriving after it, though before the 30 s deadline, is left out like a corrupt
    # one. (It is refused in the next round, before that round's cutoff, so its sender still
    # trains and sends that round in time.)
    late_chain, late_sets = _chain(f"delay:{straggler}@{round_index}={seconds:.3f}")
    corrupt_chain, corrupt_sets = _chain(f"corrupt:{straggler}@{round_index}")
    assert late_sets == corrupt_sets
    assert straggler not in late_sets[round_index]
    assert late_chain == corrupt_chain


@settings(max_examples=15, deadline=None)
@given(missing=st.sampled_from(IDS), round_index=st.integers(0, 2))
def test_exclusions_change_the_hash_only_through_the_contributor_set(
    missing: str, round_index: int
) -> None:
    # A submission that arrives too late and one that arrives corrupt both exclude a participant
    # that did train: the coordinator must commit the same chain for both.
    late_chain, late_sets = _chain(f"delay:{missing}@{round_index}")
    corrupt_chain, corrupt_sets = _chain(f"corrupt:{missing}@{round_index}")
    assert late_sets == corrupt_sets
    assert missing not in late_sets[round_index]
    assert late_chain == corrupt_chain
    assert late_chain != _fault_free_chain()[0]
