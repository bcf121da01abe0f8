"""Groups for robust aggregation under masking: deterministic, at least the group size, per round."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lensemble.errors import ConfigError
from lensemble.federation.secagg.groups import assign_groups


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(3, 60),
    size=st.integers(3, 10),
    seed=st.integers(0, 2**63 - 1),
    round_index=st.integers(0, 10**6),
)
def test_groups_cover_everyone_once_with_at_least_the_group_size(
    n: int, size: int, seed: int, round_index: int
) -> None:
    ids = [f"p{i}" for i in range(n)]
    grouping = assign_groups(ids, size, seed, round_index)
    members = [p for g in grouping.groups for p in g]
    assert sorted(members) == sorted(ids)
    assert len(grouping.groups) == max(1, n // size)
    sizes = [len(g) for g in grouping.groups]
    assert max(sizes) - min(sizes) <= 1
    assert min(sizes) >= min(size, n)
    assert all(list(g) == sorted(g) for g in grouping.groups)
    assert all(grouping.group_of(p) == i for i, g in enumerate(grouping.groups) for p in g)


def test_the_assignment_is_deterministic_and_changes_with_the_round() -> None:
    ids = [f"org-{i}" for i in range(12)]
    first = assign_groups(ids, 3, 42, 5)
    assert assign_groups(list(reversed(ids)), 3, 42, 5) == first
    assert assign_groups(ids, 3, 42, 6) != first
    assert assign_groups(ids, 3, 43, 5) != first


def test_groups_below_three_or_too_few_participants_are_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="federation.masking.group_size"):
        assign_groups(["a", "b", "c", "d"], 2, 0, 0)
    with pytest.raises(ConfigError, match="federation.participants"):
        assign_groups(["a", "b"], 3, 0, 0)
    with pytest.raises(ConfigError, match="federation.participants"):
        assign_groups(["a", "a", "b"], 3, 0, 0)
    with pytest.raises(KeyError):
        assign_groups(["a", "b", "c"], 3, 0, 0).group_of("z")
