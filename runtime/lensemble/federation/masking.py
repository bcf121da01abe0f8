"""What both sides of a masked round compute alone: its sessions, and updates as flat vectors.

Under ``federation.aggregation: masking`` each attempt of a round runs one secure-aggregation
session per group (:mod:`lensemble.federation.secagg`). The groups, each session's public
parameters and the layout of an update as one vector are functions of the config, the round,
the model's architecture and (with several groups) the attempt's present set only, so the
coordinator and every participant derive them alone and a coordinator cannot hand a participant
other ones: the session digest, which heads every message, would differ.

With several groups, an attempt's groups are drawn from its present set
(:mod:`lensemble.federation.secagg.present`): the participants present when it starts, which the
coordinator announces and each participant checks; the set is bound into every session's digest.

A session's Shamir threshold and quorum: with one group, ``federation.masking.threshold``
(default floor(2n/3) + 1) and ``federation.quorum``; with several, each group takes the
default threshold of its size and the quorum applies to the round's survivors in all groups.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from lensemble.config.schema import LensembleConfig
from lensemble.federation.payload import TensorSpec
from lensemble.federation.secagg.context import MIN_INPUTS, SessionContext, default_threshold
from lensemble.federation.secagg.fixed_point import FixedPoint
from lensemble.federation.secagg.groups import assign_groups
from lensemble.machinery.flat import concatenated


@dataclass(frozen=True, order=True)
class SessionKey:
    """Names one session: a round, its attempt, a group (0-based each)."""

    round_index: int
    attempt: int
    group: int


def dimension(architecture: Mapping[str, TensorSpec]) -> int:
    """d: the number of values of one update (every parameter's elements)."""
    return sum(int(np.prod(spec.shape, dtype=np.int64)) for spec in architecture.values())


def regroups(config: LensembleConfig) -> bool:
    """Whether an attempt's groups are drawn from its present set: several groups configured.

    With one group every configured participant is on the roster and the absent ones are the
    session's drop-outs (its threshold and quorum are the config's, whoever is present).
    """
    return config.federation.aggregation == "masking" and _several_groups(config)


def _several_groups(config: LensembleConfig) -> bool:
    """Every configured participant makes at least two groups (``assign_groups``' count)."""
    return len(config.participant_ids) // config.federation.masking.group_size >= 2


def least_present(config: LensembleConfig) -> int:
    """Fewest members of a present set: ``max(quorum, 3, group_size)``."""
    fed = config.federation
    return max(fed.quorum, MIN_INPUTS, fed.masking.group_size)


def present_set(config: LensembleConfig, present: Collection[str] | None) -> tuple[str, ...]:
    """The canonical present set: empty when it is every configured participant (or None).

    Raises:
        ValueError: ``present`` is given where the run has one group, or names unknown ids.
    """
    ids = sorted(config.participant_ids)
    members = tuple(sorted(set(present))) if present is not None else tuple(ids)
    if members == tuple(ids):
        return ()
    if not _several_groups(config):
        raise ValueError("a present set applies only where several groups are configured")
    if not set(members) <= set(ids):
        raise ValueError("the present set names participants that are not configured")
    return members


def session_contexts(
    config: LensembleConfig,
    round_index: int,
    attempt: int,
    architecture: Mapping[str, TensorSpec],
    present: Collection[str] | None = None,
) -> list[SessionContext]:
    """The public parameters of every session of one attempt, in group order.

    Args:
        config: The run's config.
        round_index: The round.
        attempt: The attempt of the round.
        architecture: The global model's tensor specs (d).
        present: The attempt's present set the groups are drawn from (several groups only);
            None or every configured participant draws them from all, as without one.

    Raises:
        ConfigError: The masking fields cannot hold (the config rules refuse such configs), or
            the present set is too small for a group.
        ValueError: ``present`` where it does not apply (:func:`present_set`).
    """
    fed, masking = config.federation, config.federation.masking
    n = len(config.participant_ids)
    members = present_set(config, present)
    ids = list(members) if members else sorted(config.participant_ids)
    grouping = assign_groups(ids, masking.group_size, config.run.root_seed, round_index)
    single = not _several_groups(config)
    # One encoding for every group: its headroom is checked for all n, so any group fits.
    codec = FixedPoint(masking.clip, masking.resolved_fractional_bits(n))
    d = dimension(architecture)
    return [
        SessionContext(
            run_id=config.run.name,
            round=round_index,
            attempt=attempt,
            group=index,
            roster=group,
            threshold=masking.resolved_threshold(n) if single else default_threshold(len(group)),
            dimension=d,
            codec=codec,
            quorum=fed.quorum if single else 0,
            present=members,
            every_signs=not single,
        )
        for index, group in enumerate(grouping.groups)
    ]


def flatten(
    tensors: Mapping[str, torch.Tensor], architecture: Mapping[str, TensorSpec]
) -> np.ndarray:
    """One update as a float32 vector of d values, parameters in the architecture's (sorted) order.

    Raises:
        KeyError: A parameter of the architecture is missing.
    """
    return concatenated({name: tensors[name] for name in architecture}, torch.float32).numpy()


def unflatten_into(vector: np.ndarray, out: Mapping[str, torch.Tensor]) -> None:
    """Copy the d values of ``vector`` into ``out``'s tensors (sorted names), in place.

    Raises:
        ValueError: ``vector`` does not hold exactly the tensors' elements.
    """
    total = sum(t.numel() for t in out.values())
    if vector.size != total:
        raise ValueError(f"a vector of {vector.size} values cannot fill {total} parameters")
    source = torch.from_numpy(np.ascontiguousarray(vector, dtype=np.float32))
    start = 0
    for name in sorted(out):
        tensor = out[name]
        tensor.copy_(source[start : start + tensor.numel()].view(tensor.shape))
        start += tensor.numel()
