"""What both sides of a masked round compute alone: its sessions, and updates as flat vectors.

Under ``federation.aggregation: masking`` each attempt of a round runs one secure-aggregation
session per group (:mod:`lensemble.federation.secagg`). The groups, each session's public
parameters and the layout of an update as one vector are functions of the config, the round
and the model's architecture only, so the coordinator and every participant derive them alone
and a coordinator cannot hand a participant other ones: the session digest, which heads every
message, would differ.

A session's Shamir threshold and quorum: with one group, ``federation.masking.threshold``
(default floor(2n/3) + 1) and ``federation.quorum``; with several, each group takes the
default threshold of its size and the quorum applies to the round's survivors in all groups.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from lensemble.config.schema import LensembleConfig
from lensemble.federation.payload import TensorSpec
from lensemble.federation.secagg.context import SessionContext, default_threshold
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


def session_contexts(
    config: LensembleConfig, round_index: int, attempt: int, architecture: Mapping[str, TensorSpec]
) -> list[SessionContext]:
    """The public parameters of every session of one attempt, in group order.

    Raises:
        ConfigError: The masking fields cannot hold (the config rules refuse such configs).
    """
    fed, masking = config.federation, config.federation.masking
    ids = sorted(config.participant_ids)
    n = len(ids)
    grouping = assign_groups(ids, masking.group_size, config.run.root_seed, round_index)
    single = len(grouping.groups) == 1
    # One encoding for every group: its headroom is checked for all n, so any group fits.
    codec = FixedPoint(masking.clip, masking.resolved_fractional_bits(n))
    d = dimension(architecture)
    return [
        SessionContext(
            run_id=config.run.name,
            round=round_index,
            attempt=attempt,
            group=index,
            roster=members,
            threshold=masking.resolved_threshold(n) if single else default_threshold(len(members)),
            dimension=d,
            codec=codec,
            quorum=fed.quorum if single else 0,
        )
        for index, members in enumerate(grouping.groups)
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
