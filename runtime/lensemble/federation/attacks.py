"""Attacks a compromised participant makes on its own update (the attack faults).

Each attack replaces the participant's honest pseudo-gradient ``x`` with a well-formed update
of the same shapes, so only the coordinator's defences stand between it and the global model
(docs/attacks.md). With ``mu`` and ``sigma`` the per-coordinate mean and standard deviation of
the honest updates ``H`` of the round, and ``n`` participants of which ``f`` attack:

- ``scaled`` (any factor ``c``, negative included): ``c * x``; ``c`` just under a norm bound
  relative to the median reverses the average without ever being clipped.
- ``alie``, "a little is enough" (Baruch, Baruch & Goldberg, NeurIPS 2019): ``mu - z * sigma``,
  ``z = Phi^-1((n - s) / n)`` with ``s = floor(n / 2 + 1) - f`` (their Algorithm 3), or the
  ``z`` given.
- ``ipm``, inner-product manipulation (Xie, Koyejo & Gupta, UAI 2019): ``-epsilon * mu``
  (default ``epsilon`` 0.5).
- ``minmax`` / ``minsum`` (Shejwalkar & Houmansadr, NDSS 2021, AGR-agnostic): ``mu + gamma * p``
  with ``p`` = ``-sigma / |sigma|`` (``std``, default), ``-mu / |mu|`` (``unit``) or
  ``-sign(mu)`` (``sign``), and ``gamma`` the largest value (bisection) whose maximum distance
  to the honest updates (min-max), or sum of squared distances (min-sum), is at most the
  largest such value among the honest updates themselves.

What ``H`` is depends on what the attacker sees. An **estimating** attack (a real
``lensemble participant --faults``) sees only its own honest update and the broadcast models:
from two consecutive global models and the public outer optimizer it recovers the previous
round's aggregate pseudo-gradient ``g`` exactly (:class:`AggregateTracker`, having tracked the
outer momentum since version 0), and takes ``H = {x, 2 g - x}``: two samples whose mean is
``g`` and whose spread is its own distance from it. Before it has seen two consecutive models
``H = {x}`` (``sigma`` = 0). An **omniscient** attack (``*_omniscient``, in-process simulation
only) sees the other participants' honest updates of the same attempt (the strongest
assumption: colluding attackers who see every honest update) and takes ``H`` = those.

Everything is float64 over the update flattened in sorted tensor-name order, on one thread, so
an attacker sends the same bytes in process and over the network.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from lensemble.config.schema import OuterOptimizerConfig
from lensemble.federation.fault_kinds import OMNISCIENT_ATTACKS
from lensemble.federation.faults import Fault, FaultPlan
from lensemble.machinery.determinism import single_threaded
from lensemble.machinery.flat import concatenated

Params = dict[str, torch.Tensor]

#: ``epsilon`` of IPM when the entry gives none (Xie et al. use 0.1 to hide and larger values
#: to flip the direction; 0.5 stays below an honest update's norm on our sites).
DEFAULT_IPM_EPSILON = 0.5
#: Bisection steps of min-max and min-sum's ``gamma`` (relative precision 2^-40).
_BISECTION_STEPS = 40
#: Largest ``gamma`` min-max and min-sum try, in units of ``|p|``.
_GAMMA_CEILING = 1e6


def alie_z(n: int, f: int) -> float:
    """ALIE's ``z`` for ``n`` participants of which ``f`` attack (Baruch et al. 2019, Alg. 3).

    ``s = floor(n / 2 + 1) - f`` honest participants must be "convinced"; ``z`` is the
    standard normal quantile of ``(n - s) / n`` (kept within [0.5, 0.999]), so 0 for 1 of 4.
    """
    s = math.floor(n / 2 + 1) - f
    return statistics.NormalDist().inv_cdf(min(max((n - s) / n, 0.5), 0.999))


def flatten(params: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Every tensor in sorted name order, as one float64 vector."""
    return concatenated(params, torch.float64)


def unflatten(vector: torch.Tensor, like: Mapping[str, torch.Tensor]) -> Params:
    """:func:`flatten`'s inverse: float32 tensors shaped like ``like``."""
    out: Params = {}
    at = 0
    for name in sorted(like):
        size = like[name].numel()
        out[name] = vector[at : at + size].reshape(like[name].shape).to(torch.float32)
        at += size
    return out


class AggregateTracker:
    """Recovers the previous round's aggregate pseudo-gradient from the broadcast models.

    The outer step (:class:`~lensemble.federation.diloco.OuterStep`) is public: with
    ``u = (theta_{t-1} - theta_t) / lr`` and the momentum ``v`` tracked since version 0, the
    aggregate is ``g = (u - mu^2 v) / (1 + mu)`` (Nesterov) or ``u - mu v``, and ``v`` becomes
    ``mu v + g``. A model seen after a gap (or a first model after version 0) restarts the
    momentum at zero, so the estimate is then approximate; a rollback looks like a step too.

    Args:
        outer: ``federation.outer_optimizer``.
    """

    def __init__(self, outer: OuterOptimizerConfig) -> None:
        self.lr, self.mu, self.nesterov = outer.lr, outer.momentum, outer.nesterov
        self._version = -1
        self._model: torch.Tensor | None = None
        self._momentum: torch.Tensor | None = None
        self.aggregate: torch.Tensor | None = None

    def observe(self, version: int, params: Mapping[str, torch.Tensor]) -> None:
        """Take the broadcast model of ``version`` (a repeat of the same version is ignored)."""
        if version == self._version:
            return
        model = flatten(params)
        if self._model is not None and version == self._version + 1:
            step = (self._model - model) / self.lr
            momentum = self._momentum if self._momentum is not None else torch.zeros_like(step)
            if self.nesterov:
                grad = (step - self.mu * self.mu * momentum) / (1.0 + self.mu)
            else:
                grad = step - self.mu * momentum
            self._momentum = self.mu * momentum + grad
            self.aggregate = grad
        else:
            self._momentum = None
            self.aggregate = None
        self._model, self._version = model, version


@dataclass(frozen=True)
class HonestView:
    """What an attack knows of the round's honest updates.

    Attributes:
        updates: ``(m, d)`` float64 honest updates (their estimate for an estimating attack).
        own: ``(d,)`` float64: the attacker's own honest update.
    """

    updates: torch.Tensor
    own: torch.Tensor

    @property
    def mean(self) -> torch.Tensor:
        """``mu``: the per-coordinate mean."""
        return self.updates.mean(0)

    @property
    def std(self) -> torch.Tensor:
        """``sigma``: the per-coordinate standard deviation (unbiased; 0 for one update)."""
        if self.updates.shape[0] < 2:
            return torch.zeros_like(self.own)
        return self.updates.std(0, unbiased=True)


def malicious_update(fault: Fault, view: HonestView, n: int, f: int) -> torch.Tensor:
    """The update ``fault``'s attack sends, from what ``view`` knows (see the module docstring).

    Args:
        fault: The attack entry (kind, value, option).
        view: The honest updates it knows and its own.
        n: Participants in the run.
        f: Participants attacking together.

    Returns:
        ``(d,)`` float64.
    """
    kind = fault.kind.removesuffix("_omniscient")
    if kind == "scaled":
        return (fault.value if fault.value is not None else 1.0) * view.own
    if kind == "alie":
        z = fault.value if fault.value is not None else alie_z(n, f)
        return view.mean - z * view.std
    if kind == "ipm":
        epsilon = fault.value if fault.value is not None else DEFAULT_IPM_EPSILON
        return -epsilon * view.mean
    return _min_distance_attack(kind, fault.option or "std", view)


def _direction(option: str, mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """The perturbation ``p`` of min-max and min-sum."""
    if option == "std" and float(sigma.norm()) > 0:
        return sigma.neg().div(sigma.norm())
    if option == "sign":
        return torch.sign(mu).neg()
    norm = float(mu.norm())
    return -mu / norm if norm > 0 else torch.zeros_like(mu)


def _min_distance_attack(kind: str, option: str, view: HonestView) -> torch.Tensor:
    """Min-max or min-sum: ``mu + gamma p`` with the largest ``gamma`` that stays plausible."""
    honest, mu = view.updates, view.mean
    p = _direction(option, mu, view.std)
    distances = torch.cdist(honest, honest)
    if kind == "minmax":
        bound = float(distances.max())

        def plausible(gamma: float) -> bool:
            return float(torch.linalg.vector_norm(honest - (mu + gamma * p), dim=1).max()) <= bound

    else:
        bound = float((distances**2).sum(1).max())

        def plausible(gamma: float) -> bool:
            distances = torch.linalg.vector_norm(honest - (mu + gamma * p), dim=1)
            return float((distances**2).sum()) <= bound

    low, high = 0.0, 1.0
    while plausible(high) and high < _GAMMA_CEILING:
        high *= 2
    for _ in range(_BISECTION_STEPS):
        middle = (low + high) / 2
        low, high = (middle, high) if plausible(middle) else (low, middle)
    return mu + low * p


class Attacker:
    """A compromised participant: its attack entries, and what it has seen of the run.

    Args:
        plan: The participant's own fault entries (attacks and ``misreport``); ``plan.hostile``
            is ``f``.
        participant_id: The participant.
        n: Participants in the run.
        outer: ``federation.outer_optimizer`` (public: every participant's config has it).
    """

    def __init__(
        self, plan: FaultPlan, participant_id: str, n: int, outer: OuterOptimizerConfig
    ) -> None:
        self.plan = plan
        self.id = participant_id
        self.n = n
        self.f = max(1, plan.hostile)
        self.tracker = AggregateTracker(outer)

    def attack(self, round_index: int, attempt: int) -> Fault | None:
        """The attack this participant makes in this attempt, if any."""
        return self.plan.attack_on(self.id, round_index, attempt)

    def needs_peers(self, round_index: int, attempt: int) -> bool:
        """True when this attempt's attack sees the honest updates (an omniscient one)."""
        fault = self.attack(round_index, attempt)
        return fault is not None and fault.kind in OMNISCIENT_ATTACKS

    def observe(self, version: int, params: Mapping[str, torch.Tensor]) -> None:
        """See the broadcast model of ``version`` (every attempt, attacking or not)."""
        with single_threaded():
            self.tracker.observe(version, params)

    def tamper(
        self,
        round_index: int,
        attempt: int,
        delta: Params,
        peers: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
    ) -> Params:
        """The update to send instead of ``delta`` in this attempt (``delta`` when honest).

        Args:
            round_index: The round.
            attempt: Its attempt.
            delta: This participant's honest pseudo-gradient (float32).
            peers: Other participants' honest updates of the attempt (omniscient attacks
                only; ignored by the others).

        Raises:
            ValueError: An omniscient attack is given no peers.
        """
        fault = self.attack(round_index, attempt)
        if fault is None:
            return delta
        with single_threaded():
            own = flatten(delta)
            if fault.kind in OMNISCIENT_ATTACKS:
                if not peers:
                    raise ValueError(f"{fault.spec()} needs the honest updates of the round")
                honest = torch.stack([flatten(peers[pid]) for pid in sorted(peers)])
            elif self.tracker.aggregate is not None:
                honest = torch.stack([own, 2 * self.tracker.aggregate - own])
            else:
                honest = own.unsqueeze(0)
            sent = malicious_update(fault, HonestView(honest, own), self.n, self.f)
            return unflatten(sent, delta)

    def report(self, round_index: int, attempt: int, loss: float | None) -> float | None:
        """The held-out loss to report: ``misreport``'s factor times the true one."""
        fault = self.plan.hits("misreport", self.id, round_index, attempt)
        if fault is None or loss is None or fault.value is None:
            return loss
        return loss * fault.value
