"""Defences against poisoned updates: norm bounds, robust aggregators, the pre-commit check.

All of it is deterministic and reduces in canonical (sorted) participant order, so the committed
hash never depends on arrival order (docs/concepts.md#deterministic-aggregation):

- :func:`screen` bounds every update's L2 norm (``federation.robustness``): an absolute bound
  and/or ``k`` times the median norm of the round's contributors; an update above it is clipped
  (scaled down to the bound) or rejected. Norms are float64 sums over float32 values, taken in
  sorted tensor-name order; clipping multiplies in float64 and rounds once to float32.
- :func:`aggregate` combines the screened updates: the plain mean (DiLoCo's, bit-identical to
  :func:`~lensemble.federation.diloco.canonical_mean`), the coordinate-wise trimmed mean or the
  coordinate-wise median. Coordinates are processed in fixed-size blocks, so memory stays at
  ``n`` blocks, not ``n`` copies of the model.
- :func:`momentum_shortfalls` and :func:`lift_to_floor` bound how hard an update may pull
  against the outer momentum (the direction the federation has been moving in): the component
  of a kept update against the momentum's direction beyond ``momentum_cosine_floor`` times its
  norm is removed from the mean, one more pass over the momentum instead of over the updates.
- :func:`precommit_problem` checks the new global model before it is committed: every value
  finite, and the change bounded relative to the current model.

Decisions are returned as plain data (:class:`Screening`) for the ledger and for metrics.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from lensemble.config.schema import RobustnessConfig
from lensemble.federation.diloco import MEAN_BLOCK, canonical_mean
from lensemble.federation.quantization import all_finite
from lensemble.federation.spool import UpdateSpool
from lensemble.federation.spool_reader import SpooledUpdate
from lensemble.machinery.determinism import single_threaded

Params = dict[str, torch.Tensor]

#: Coordinates per block of the coordinate-wise aggregators (elements). The mean reads the
#: spool in blocks of :data:`~lensemble.federation.diloco.MEAN_BLOCK` (any size gives the same
#: sums; a block of every update fits in cache with its accumulator).
BLOCK = 1 << 18


def update_norm(delta: Mapping[str, torch.Tensor]) -> float:
    """L2 norm of a whole update over all its tensors, in float64.

    Args:
        delta: Name -> float32 tensor.

    Returns:
        The norm (unitless); finite for any finite float32 input. Computed on one thread: a
        norm is a reduction whose bits depend on how torch splits it over threads, and it
        decides clipping, so it must not depend on the coordinator machine's core count.
    """
    return _l2(delta[name] for name in sorted(delta))


def update_dot(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """Dot product of two updates over all their tensors (same names and shapes), in float64.

    Summed per tensor in sorted name order on one thread, as :func:`update_norm`.
    """
    total = 0.0
    with single_threaded():
        for name in sorted(a):
            total += float(torch.dot(a[name].reshape(-1).double(), b[name].reshape(-1).double()))
    return total


def cosine(
    delta: Mapping[str, torch.Tensor],
    norm: float,
    reference: Mapping[str, torch.Tensor],
    reference_norm: float,
) -> float | None:
    """Cosine of an update (of L2 norm ``norm``) with a reference (of norm ``reference_norm``).

    Returns:
        The cosine in float64 (:func:`update_dot` over both norms), or None when either norm
        is 0 or the result is not finite.
    """
    if reference_norm <= 0 or norm <= 0:
        return None
    value = update_dot(delta, reference) / (norm * reference_norm)
    return value if math.isfinite(value) else None


def _l2(tensors: Iterable[torch.Tensor]) -> float:
    """L2 norm over several tensors: float64 norms of each, squared and summed in turn."""
    total = 0.0
    with single_threaded():
        for tensor in tensors:
            part = float(torch.linalg.vector_norm(tensor, ord=2, dtype=torch.float64))
            total += part * part
    return math.sqrt(total)


def _short(x: float) -> float | None:
    """A float for the ledger: 6 significant digits, None when not finite."""
    return float(f"{x:.6g}") if math.isfinite(x) else None


@dataclass
class Screening:
    """The outcome of :func:`screen` for one round attempt.

    Attributes:
        kept: Participant id -> update to aggregate (clipped ones scaled down); empty from
            :func:`decide`, which sees norms only.
        kept_ids: The ids of the updates to aggregate, sorted.
        norms: Participant id -> L2 norm before any clipping.
        bound: The norm bound applied this round, or None when there was none.
        clipped: Participant id -> factor its update was multiplied by (< 1).
        rejected: Participant id -> one sentence saying why it was left out.
        shortfalls: Participant id -> how far below ``momentum_cosine_floor`` its cosine with
            the outer momentum is (< 0), for kept updates whose excess pull against the
            momentum :func:`lift_to_floor` removes.
    """

    kept: dict[str, Params]
    norms: dict[str, float] = field(default_factory=dict)
    kept_ids: list[str] = field(default_factory=list)
    bound: float | None = None
    clipped: dict[str, float] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    shortfalls: dict[str, float] = field(default_factory=dict)
    set_aside: dict[str, float] | None = None

    def to_record(self) -> dict[str, Any]:
        """The decisions as plain JSON data (for the ledger's ``defences`` field)."""
        aside = (
            {} if self.set_aside is None else {"set_aside": dict(sorted(self.set_aside.items()))}
        )
        return aside | {
            "norms": {pid: _short(n) for pid, n in sorted(self.norms.items())},
            "norm_bound": _short(self.bound) if self.bound is not None else None,
            "clipped": {pid: _short(f) for pid, f in sorted(self.clipped.items())},
            "rejected": dict(sorted(self.rejected.items())),
            "below_momentum_floor": {pid: _short(f) for pid, f in sorted(self.shortfalls.items())},
        }


def norm_bound(norms: Mapping[str, float], config: RobustnessConfig) -> float | None:
    """The round's norm bound: the smaller of the absolute one and ``k`` x the median norm.

    Returns:
        The bound, or None when the mode is ``off`` or no bound is configured.
    """
    if config.norm_bound_mode == "off" or not norms:
        return None
    bounds = []
    if config.norm_bound is not None:
        bounds.append(config.norm_bound)
    if config.median_factor is not None:
        median = statistics.median(norms[pid] for pid in sorted(norms))
        if median > 0:  # all-zero updates: nothing to scale against
            bounds.append(config.median_factor * median)
    return min(bounds) if bounds else None


def _scaled(delta: Mapping[str, torch.Tensor], factor: float) -> Params:
    return {name: (delta[name].double() * factor).to(torch.float32) for name in sorted(delta)}


def decide(norms: Mapping[str, float], config: RobustnessConfig) -> Screening:
    """The norm-bound decisions of a round from its updates' norms alone.

    Args:
        norms: Participant id -> L2 norm (:func:`update_norm`) of its float32 update.
        config: ``federation.robustness``.

    Returns:
        A :class:`Screening` whose ``kept`` is empty: ``kept_ids`` lists the updates to
        aggregate, ``clipped`` the factor of each one to scale down, ``rejected`` the others.
    """
    bound = norm_bound(norms, config)
    out = Screening(kept={}, norms={pid: norms[pid] for pid in sorted(norms)}, bound=bound)
    for pid in sorted(norms):
        norm = norms[pid]
        if bound is None or norm <= bound:
            out.kept_ids.append(pid)
        elif config.norm_bound_mode == "clip":
            out.clipped[pid] = bound / norm
            out.kept_ids.append(pid)
        else:
            out.rejected[pid] = f"L2 norm {norm:.4g} is above the round's bound {bound:.4g}."
    return out


def screen(deltas: Mapping[str, Mapping[str, torch.Tensor]], config: RobustnessConfig) -> Screening:
    """Apply the per-update norm bound to a round's accepted updates.

    Args:
        deltas: Participant id -> float32 pseudo-gradient (all finite).
        config: ``federation.robustness``.

    Returns:
        Which updates are kept (clipped or not) and which are rejected, with their norms. An
        update within the bound is kept as the same tensors, untouched.
    """
    out = decide({pid: update_norm(deltas[pid]) for pid in sorted(deltas)}, config)
    for pid in out.kept_ids:
        factor = out.clipped.get(pid)
        out.kept[pid] = dict(deltas[pid]) if factor is None else _scaled(deltas[pid], factor)
    return out


def momentum_shortfalls(
    screening: Screening, cosines: Mapping[str, float | None], floor: float | None
) -> dict[str, float]:
    """How far below ``floor`` each kept update's cosine with the outer momentum is.

    Args:
        screening: The round's norm decisions (which updates are kept).
        cosines: Participant id -> cosine of its update with the momentum (None: no momentum).
        floor: ``federation.robustness.momentum_cosine_floor`` (None: no floor).

    Returns:
        Participant id -> ``cosine - floor`` (< 0), for the kept updates below the floor.
    """
    out: dict[str, float] = {}
    for pid in screening.kept_ids:
        cosine = cosines.get(pid)
        if floor is not None and cosine is not None and cosine < floor:
            out[pid] = cosine - floor
    return out


def lift_to_floor(
    combined: Params, momentum: Mapping[str, torch.Tensor], screening: Screening
) -> None:
    """Take out of the mean each kept update's pull against the momentum beyond the floor.

    An update ``x`` (clipped by ``f``) whose cosine with the momentum ``m`` is ``c`` below the
    floor ``c0`` loses its component ``f |x| (c - c0)`` along ``m / |m|``: its cosine becomes
    ``c0`` (to first order; its norm shrinks). Summed over the updates and divided by their
    count, that is one multiple of ``m`` subtracted from the mean: the coefficient in float64,
    in sorted id order, each tensor rounded once to float32. Nothing happens without
    shortfalls, so a round without them is bit-identical to the mean of the clipped updates.

    Args:
        combined: The mean of the kept (clipped) updates, changed in place.
        momentum: The outer momentum the cosines were taken with.
        screening: Its decisions (norms, clip factors, kept ids, shortfalls).
    """
    if not screening.shortfalls:
        return
    total = 0.0
    for pid in sorted(screening.shortfalls):
        length = screening.norms[pid] * screening.clipped.get(pid, 1.0)
        total += length * screening.shortfalls[pid]
    coefficient = total / len(screening.kept_ids) / update_norm(momentum)
    with single_threaded():
        for name in sorted(combined):
            combined[name].sub_((momentum[name].double() * coefficient).to(torch.float32))


def trim_count(n: int, fraction: float) -> int:
    """Values dropped at each end of a coordinate by the trimmed mean of ``n`` updates.

    ``ceil(fraction * n)``, at most ``(n - 1) // 2`` so that at least one value remains.
    """
    return min(math.ceil(fraction * n), (n - 1) // 2)


def _trimmed_mean_rows(n: int, fraction: float) -> Any:
    """The trimmed mean of sorted ``(n, block)`` rows: the kept rows summed in ascending order."""
    k = trim_count(n, fraction)
    count = torch.tensor(float(n - 2 * k), dtype=torch.float32)

    def reduce(ordered: torch.Tensor) -> torch.Tensor:
        acc = torch.zeros(ordered.shape[1], dtype=torch.float32)
        for row in range(k, n - k):
            acc = acc + ordered[row]
        return acc / count

    return reduce


def _median_rows(n: int) -> Any:
    """The median of sorted ``(n, block)`` rows; halves are added (``a/2 + b/2``)."""

    def reduce(ordered: torch.Tensor) -> torch.Tensor:
        if n % 2:
            return ordered[n // 2].clone()
        return ordered[n // 2 - 1] * 0.5 + ordered[n // 2] * 0.5

    return reduce


def _coordinate_wise(deltas: Mapping[str, Mapping[str, torch.Tensor]], reduce: Any) -> Params:
    order = sorted(deltas)
    out: Params = {}
    for name in sorted(deltas[order[0]]):
        shape = deltas[order[0]][name].shape
        flats = [deltas[pid][name].reshape(-1).to(torch.float32) for pid in order]
        result = torch.empty(flats[0].numel(), dtype=torch.float32)
        for start in range(0, result.numel(), BLOCK):
            stop = min(start + BLOCK, result.numel())
            stacked = torch.stack([f[start:stop] for f in flats])  # canonical order
            result[start:stop] = reduce(torch.sort(stacked, dim=0).values)
        out[name] = result.reshape(shape)
    return out


def coordinate_trimmed_mean(
    deltas: Mapping[str, Mapping[str, torch.Tensor]], fraction: float
) -> Params:
    """Per coordinate: drop the :func:`trim_count` smallest and largest values, average the rest.

    Args:
        deltas: Participant id -> name -> float32 tensor (same names and shapes); at least one.
        fraction: ``federation.robustness.trim_fraction``.

    Returns:
        Name -> float32 tensor. The kept values are summed in ascending order, one row at a
        time, so the result depends only on the set of updates.
    """
    return _coordinate_wise(deltas, _trimmed_mean_rows(len(deltas), fraction))


def coordinate_median(deltas: Mapping[str, Mapping[str, torch.Tensor]]) -> Params:
    """Per coordinate: the median value; for an even count, the mean of the two middle ones.

    Args:
        deltas: Participant id -> name -> float32 tensor (same names and shapes); at least one.

    Returns:
        Name -> float32 tensor. Halves are added (``a/2 + b/2``), which cannot overflow.
    """
    return _coordinate_wise(deltas, _median_rows(len(deltas)))


def aggregate(deltas: Mapping[str, Mapping[str, torch.Tensor]], config: RobustnessConfig) -> Params:
    """Combine screened updates with ``federation.robustness.aggregator``.

    Raises:
        ValueError: ``deltas`` is empty.
    """
    if not deltas:
        raise ValueError("aggregate needs at least one contribution")
    if config.aggregator == "trimmed_mean":
        return coordinate_trimmed_mean(deltas, config.trim_fraction)
    if config.aggregator == "median":
        return coordinate_median(deltas)
    return canonical_mean(deltas)


def aggregate_spooled(
    spool: UpdateSpool,
    screening: Screening,
    shapes: Mapping[str, tuple[int, ...]],
    config: RobustnessConfig,
    *,
    scheme: str,
    chunk: int,
    out: Params | None = None,
) -> Params:
    """:func:`aggregate` over spilled updates, holding one block per update at a time.

    Bit-identical to :func:`aggregate` over the dequantized (and clipped) updates: the mean
    adds every update into one float32 accumulator in sorted id order, block by block; the
    coordinate-wise aggregators sort the same :data:`BLOCK`-element columns. Each update's
    bytes are re-hashed as they are read; the result is returned only when all of them are the
    bytes that were accepted.

    Args:
        spool: The round's accepted payloads.
        screening: :func:`decide`'s verdicts (which ids, which clipping factors).
        shapes: Parameter name -> shape of the global model.
        config: ``federation.robustness``.
        scheme: ``federation.quantization``.
        chunk: ``federation.int8_chunk``.
        out: Float32 buffers of ``shapes`` to write the result into (any content: every
            element is written before it is read), reused from round to round so that no
            model-sized buffer is allocated each time; new ones when None.

    Returns:
        Name -> float32 tensor of ``shapes`` (views of ``out`` when given).

    Raises:
        ValueError: No update is kept.
        IntegrityError: A spilled update is not the payload that was accepted.
    """
    order = sorted(screening.kept_ids)
    if not order:
        raise ValueError("aggregate needs at least one contribution")
    # Every element is written before it is read: the mean's first update lands as d_0 + 0.0.
    flat = {
        name: (
            out[name].view(-1)
            if out is not None
            else torch.empty(math.prod(shape), dtype=torch.float32)
        )
        for name, shape in shapes.items()
    }
    mean = config.aggregator == "mean"
    updates: list[SpooledUpdate] = []
    try:
        for pid in order:
            updates.append(
                spool.reader(
                    pid,
                    scheme=scheme,
                    chunk=chunk,
                    block=MEAN_BLOCK if mean else BLOCK,
                    factor=screening.clipped.get(pid),
                )
            )
        _reduce_blocks(updates, flat, None if mean else _row_reducer(config, len(order)))
        for update in updates:
            update.finish()
    finally:
        for update in updates:
            update.close()
    if mean:
        count = torch.tensor(float(len(order)), dtype=torch.float32)
        return {name: flat[name].div_(count).reshape(shape) for name, shape in shapes.items()}
    return {name: flat[name].reshape(shape) for name, shape in shapes.items()}


def _row_reducer(config: RobustnessConfig, count: int) -> Any:
    """The coordinate-wise reduction of ``count`` sorted rows (trimmed mean or median)."""
    if config.aggregator == "trimmed_mean":
        return _trimmed_mean_rows(count, config.trim_fraction)
    return _median_rows(count)


def _reduce_blocks(
    updates: list[SpooledUpdate],
    flat: Params,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None,
) -> None:
    """Combine the updates block by block into ``flat``: their sum, or ``reduce`` of the rows.

    Block by block across all updates (each yields the same blocks in the same order), so an
    accumulator block stays in cache while every update adds into it.
    """
    for parts in zip(*(u.blocks() for u in updates), strict=True):
        name, start, first = parts[0]
        target = flat[name][start : start + first.numel()]
        if reduce is None:
            # Canonical order: ((0 + d_0) + d_1) + ...; d_0 + 0.0 is 0.0 + d_0 bit for bit
            # (-0.0 becomes +0.0 either way), without a pass that writes zeros first.
            torch.add(first, 0.0, out=target)
            for _, _, values in parts[1:]:
                target.add_(values)
        else:
            stacked = torch.stack([values for _, _, values in parts])  # canonical order
            target.copy_(reduce(torch.sort(stacked, dim=0).values))


def precommit_problem(
    current: Mapping[str, torch.Tensor],
    new: Mapping[str, torch.Tensor],
    max_relative_change: float,
    *,
    on_checked: Callable[[str, torch.Tensor], None] | None = None,
) -> tuple[float | None, str | None]:
    """Check a new global model before it is committed.

    Args:
        current: ``theta_t`` (float32).
        new: ``theta_{t+1}`` (float32, same names and shapes); each tensor is read once.
        max_relative_change: ``federation.robustness.max_relative_change``.
        on_checked: Called with each new tensor once it is found finite, in sorted name
            order, before the next is read (the coordinator hashes it there, see
            :func:`~lensemble.federation.payload.model_hash_behind`).

    Returns:
        ``(relative change, problem)``: ``||new - current|| / max(1, ||current||)`` in float64,
        L2 over all tensors (None when the new model is not finite); and None when the model may
        be committed, else one sentence saying why not: a tensor with NaN or Inf, or a relative
        change above ``max_relative_change``.
    """
    # Each new tensor is read once (``new`` may compute it on access, see
    # OuterStep.candidate); the sums are update_norm's over the differences.
    total = 0.0
    with single_threaded():
        for name in sorted(new):
            value = new[name]
            if not all_finite(value):
                return None, f"the new global model's tensor '{name}' has NaN or Inf values."
            if on_checked is not None:
                on_checked(name, value)
            part = float(
                torch.linalg.vector_norm(value - current[name], ord=2, dtype=torch.float64)
            )
            total += part * part
    change = math.sqrt(total) / max(1.0, update_norm(current))
    if not change <= max_relative_change:
        return change, (
            f"the new global model moves by {change:.4g} x max(1, its current L2 norm), more "
            f"than federation.robustness.max_relative_change ({max_relative_change:g})."
        )
    return change, None
