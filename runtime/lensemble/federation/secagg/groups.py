"""Secure aggregation over groups, so that a robust aggregator still has several inputs.

Under masking the coordinator sees only sums, so it cannot judge a single update. Splitting the
participants into groups of at least ``group_size`` (3 or more) and running one session per group
gives one sum per group; a robust aggregator (median, trimmed mean) over the group means then
bounds what a minority of poisoned groups can do. What it guarantees:

- Privacy: the coordinator learns each group's sum, so a participant hides among the other
  members of its group (at least ``group_size - 1``), not among all participants.
- Robustness: k malicious participants poison at most k group sums; the coordinate-wise median
  over g groups stays within the range of the honest group means while k <= (g - 1) // 2.
  A malicious participant can still move its own group's sum anywhere the fixed-point range
  holds (about n * clip per coordinate: the clip binds only participants that follow the
  protocol), and with g = 1 (fewer than 2 * group_size participants) nothing is gained.

The assignment is a deterministic function of ``run.root_seed``, the round and the ids (a
SHA-256 keyed shuffle), so every party computes it alone and a rerun gives the same groups;
it changes every round, so no participant stays with the same partners. The ids are an
attempt's present set (:mod:`lensemble.federation.secagg.present`): each id's place in the
order depends on the seed, the round and itself only, so the groups of a subset are runs of
the same public order, and the coordinator that chooses the set chooses among those runs
(docs/security.md, "what a hostile coordinator gains by choosing the set").
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from lensemble.errors import ConfigError, ConfigProblem
from lensemble.federation.secagg.context import MIN_INPUTS

GROUP_SIZE_FIELD = "federation.masking.group_size"


@dataclass(frozen=True)
class Grouping:
    """The groups of one round, each sorted; sizes differ by at most one.

    Attributes:
        groups: The groups, in assignment order; group i runs the session with ``group=i``.
    """

    groups: tuple[tuple[str, ...], ...]

    def group_of(self, participant: str) -> int:
        """The index of ``participant``'s group.

        Raises:
            KeyError: The participant is in no group.
        """
        for index, members in enumerate(self.groups):
            if participant in members:
                return index
        raise KeyError(participant)


def _shuffle_key(root_seed: int, round_index: int, participant: str) -> bytes:
    label = f"lensemble-secagg-groups-v1:{root_seed}:{round_index}:{participant}"
    return hashlib.sha256(label.encode()).digest()


def assign_groups(
    participants: Sequence[str], group_size: int, root_seed: int, round_index: int
) -> Grouping:
    """Split ``participants`` into ``max(1, n // group_size)`` groups of near-equal size.

    Args:
        participants: The round's participants (any order; duplicates refused).
        group_size: The least members of a group, at least 3.
        root_seed: ``run.root_seed``.
        round_index: The round (groups change every round).

    Returns:
        Groups of ``n // g`` or ``n // g + 1`` members, each at least ``group_size`` when
        ``n >= group_size`` (else one group of everyone).

    Raises:
        ConfigError: ``group_size`` below 3, fewer than 3 participants, or duplicate ids.
    """
    if group_size < MIN_INPUTS:
        raise ConfigError(
            [
                ConfigProblem(
                    GROUP_SIZE_FIELD,
                    f"{group_size} is below {MIN_INPUTS}: a group of "
                    "two would show each member the other's update;",
                )
            ]
        )
    ids = list(participants)
    if len(set(ids)) != len(ids) or len(ids) < MIN_INPUTS:
        raise ConfigError(
            [
                ConfigProblem(
                    "federation.participants",
                    f"masking needs at least {MIN_INPUTS} distinct participants, not {ids};",
                )
            ]
        )
    order = sorted(ids, key=lambda p: (_shuffle_key(root_seed, round_index, p), p))
    count = max(1, len(order) // group_size)
    size, extra = divmod(len(order), count)
    groups: list[tuple[str, ...]] = []
    start = 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        groups.append(tuple(sorted(order[start:end])))
        start = end
    return Grouping(tuple(groups))
