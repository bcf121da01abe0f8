"""What a participant computes inside its trust domain: DiLoCo's inner loop on its own data.

:class:`WorldModelLearner` implements :class:`lensemble.learner.Learner`. Each round
it loads the global parameters, runs ``H`` AdamW steps of the JEPA objective
(:mod:`lensemble.model.objective`) on windows of its private trajectories, and returns its local
parameters; the runtime turns them into the pseudo-gradient. As in DiLoCo (Douillard et al.,
arXiv 2311.08105, Algorithm 1) the inner optimizer state, and the EMA target encoder when
``model.target == "ema"``, stay with the participant across rounds; only the parameters are reset
to the global model.

Results are bit-identical for identical inputs, in this process or a fresh one: batches come from
a generator seeded by ``derive(root_seed, f"batches:{participant_id}:round:{round_index}")``,
nothing reads torch's global random state, AdamW's implementation is pinned (``foreach=True``
rather than torch's default), and the inner steps run single-threaded
(:func:`lensemble.machinery.determinism.single_threaded`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch

from lensemble.errors import ArchitectureMismatch, IntegrityError
from lensemble.learner import LocalRound
from lensemble.machinery.determinism import single_threaded
from lensemble.model.kstep import heldout_error
from lensemble.model.objective import jepa_loss
from lensemble.model.privacy_budget import PrivacyBudget, planned_noise_multiplier
from lensemble.model.worldmodel import (
    Params,
    WorldModel,
    build_model,
    check_architecture,
    initial_parameters,
)
from lensemble.seeds import derive

if TYPE_CHECKING:
    from opacus.optimizers import DPOptimizer

    from lensemble.config.schema import LensembleConfig, PrivacyConfig
    from lensemble.data.trajectories import ParticipantData

_MOMENTS = ("exp_avg", "exp_avg_sq", "step")
#: Inner-state entry of the DP-SGD steps a participant has taken (its privacy spend): float64
#: ``[k, 3]``, one ``(sigma, q, steps)`` row per stretch of steps at the same mechanism.
PRIVACY_SPEND = "privacy.spend"


def check_inner_state(
    state: Mapping[str, torch.Tensor],
    params: Mapping[str, torch.Tensor],
    participant_id: str,
    *,
    encoder: Mapping[str, torch.Tensor] | None = None,
) -> None:
    """Check a participant's saved inner state against the model it is loaded into.

    The state holds ``optimizer.{exp_avg,exp_avg_sq,step}.<name>`` for every parameter when it
    holds any optimizer entry, ``ema.encoder.<name>`` for every encoder parameter when it
    holds any EMA entry (only with an ``encoder`` given), and may hold ``privacy.spend`` (rows
    of ``(sigma, q, steps)``); an empty state is always valid.

    Args:
        state: Name -> tensor, as a learner's ``inner_state()`` returned it.
        params: The model's parameters, name -> tensor (shapes are compared).
        participant_id: Names the participant in the error.
        encoder: The encoder's parameters, when the learner keeps an EMA target.

    Raises:
        IntegrityError: Names or shapes do not belong to this model's inner state.
    """
    expected: Params = {}
    if any(key.startswith("optimizer.") for key in state):
        for name, p in params.items():
            expected[f"optimizer.exp_avg.{name}"] = p
            expected[f"optimizer.exp_avg_sq.{name}"] = p
            expected[f"optimizer.step.{name}"] = torch.zeros(())
    if encoder is not None and any(key.startswith("ema.") for key in state):
        expected.update({f"ema.encoder.{n}": p for n, p in encoder.items()})
    spend = state.get(PRIVACY_SPEND)
    if spend is not None:
        rows = spend.shape[0] if spend.dim() == 2 else 1  # any number of (sigma, q, steps) rows
        expected[PRIVACY_SPEND] = torch.zeros((rows, 3), dtype=torch.float64)
    try:
        check_architecture(state, expected, f"inner state of participant '{participant_id}'")
    except ArchitectureMismatch as exc:
        raise IntegrityError(
            exc.message,
            remediation="resume from a checkpoint of this run, or delete the participant's "
            "inner state to start it afresh.",
        ) from exc


class WorldModelLearner:
    """A participant's local training of the world model (the DiLoCo inner loop).

    With ``privacy`` (the participant's own section, ``federation.participants[i].privacy``)
    every inner step is a DP-SGD step (:mod:`lensemble.model.dp_sgd`) and the learner keeps its
    privacy budget (:class:`~lensemble.model.privacy_budget.PrivacyBudget`): it refuses a round
    that would spend past it, reports what it has spent, and reports no training loss (an
    unprotected statistic of its records).

    Args:
        config: The run's config (``model``, ``data.window``, ``federation.inner_optimizer``).
        participant_id: This participant's id (seeds its batches).
        data: Its private data; only ``data.train`` is trained on.
        privacy: Differential privacy of the inner steps, None for plain AdamW steps.
        noise_seed: The participant's secret seed of DP-SGD's randomness; None derives it from
            ``run.root_seed`` and the id, as a simulation does (not secret).
    """

    def __init__(
        self,
        config: LensembleConfig,
        participant_id: str,
        data: ParticipantData,
        *,
        privacy: PrivacyConfig | None = None,
        noise_seed: int | None = None,
    ) -> None:
        self.config = config
        self.participant_id = participant_id
        self.data = data
        self.model: WorldModel = build_model(config, data.spec)
        self._names = [name for name, _ in self.model.named_parameters()]
        opt = config.federation.inner_optimizer
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=opt.lr,
            betas=opt.betas,
            eps=opt.eps,
            weight_decay=opt.weight_decay,
            foreach=True,
        )
        self._target: WorldModel | None = None
        self._obs = data.train.obs
        self._actions = data.train.actions
        self._scorer: WorldModel | None = None  # scores received models (heldout_loss)
        self.privacy = privacy
        self.budget: PrivacyBudget | None = None
        self._dp: DPOptimizer | None = None
        self._noise_seed = 0
        if privacy is not None:
            from lensemble.model.dp_sgd import dp_optimizer

            fed = config.federation
            sigma = planned_noise_multiplier(privacy, fed.rounds * fed.inner_steps)
            self.budget = PrivacyBudget(participant_id, privacy, sigma)
            self._dp = dp_optimizer(self.optimizer, privacy, sigma, int(self._obs.shape[0]))
            self._noise_seed = (
                noise_seed
                if noise_seed is not None
                else derive(config.run.root_seed, f"dp-noise:{participant_id}")
            )

    # ------------------------------------------------------------------ the Learner protocol
    def train_round(
        self, global_params: Mapping[str, torch.Tensor], round_index: int, steps: int
    ) -> LocalRound:
        """Start from ``global_params`` and run ``steps`` AdamW steps on private windows.

        Args:
            global_params: The global model theta_t: name -> tensor, the world model's names
                and shapes.
            round_index: The round (seeds the batches).
            steps: Inner steps ``H`` (count).

        Returns:
            Local parameters theta_c (``model.dtype``), the mean total loss over the steps, and
            the wall time of the steps (seconds).

        Raises:
            ArchitectureMismatch: ``global_params`` does not match the world model.
        """
        current = dict(self.model.named_parameters())
        check_architecture(global_params, current, "global parameters")
        if self.budget is not None:
            self.budget.require(steps, round_index)
        seed = derive(
            self.config.run.root_seed, f"batches:{self.participant_id}:round:{round_index}"
        )
        generator = torch.Generator().manual_seed(seed)
        m = self.config.model
        batch = self.config.federation.inner_optimizer.batch_size
        start = time.perf_counter()
        total = torch.zeros((), dtype=torch.float64)
        with single_threaded():
            with torch.no_grad():
                for name, param in current.items():
                    param.copy_(global_params[name])
            if m.target == "ema" and self._target is None:
                self._target = build_model(self.config, self.data.spec)
                self._target.load_state_dict(self.model.state_dict())
            target = self._target.encode if self._target is not None else None
            if self._dp is not None:
                return self._private_round(steps, round_index, target, start)
            for _ in range(steps):
                obs, actions = self._sample(generator, batch)
                terms = jepa_loss(
                    self.model,
                    obs,
                    actions,
                    regularizer=m.regularizer,
                    weight=m.regularizer_weight,
                    generator=generator,
                    target_encoder=target,
                )
                self.optimizer.zero_grad(set_to_none=True)
                torch.autograd.backward(terms.total)
                self.optimizer.step()
                total += terms.total.detach().double()
                if self._target is not None:
                    self._update_ema(m.ema_decay)
        seconds = time.perf_counter() - start
        params = {name: p.detach().clone() for name, p in self.model.named_parameters()}
        return LocalRound(
            params=params, mean_loss=float(total) / max(steps, 1), compute_seconds=seconds
        )

    def _private_round(
        self,
        steps: int,
        round_index: int,
        target: Callable[[torch.Tensor], torch.Tensor] | None,
        start: float,
    ) -> LocalRound:
        """``steps`` DP-SGD steps (inside :meth:`train_round`); the spend is counted after."""
        from lensemble.model.dp_sgd import private_step

        assert self._dp is not None and self.budget is not None and self.privacy is not None
        secret = torch.Generator().manual_seed(derive(self._noise_seed, f"round:{round_index}"))
        self._dp.generator = secret
        for _ in range(steps):
            private_step(
                self.model,
                self.config,
                self._dp,
                privacy=self.privacy,
                data=(self._obs, self._actions),
                generator=secret,
                target_encoder=target,
            )
            self.budget.steps += 1
            if self._target is not None:
                self._update_ema(self.config.model.ema_decay)
        seconds = time.perf_counter() - start
        params = {name: p.detach().clone() for name, p in self.model.named_parameters()}
        return LocalRound(
            params=params,
            mean_loss=math.nan,
            compute_seconds=seconds,
            privacy_epsilon=self.budget.spent,
        )

    def heldout_loss(self, global_params: Mapping[str, torch.Tensor]) -> float | None:
        """The normalised k-step latent error of ``global_params`` on this site's held-out data.

        ``evaluation.k_steps`` steps, as the evaluation scores each site
        (:func:`lensemble.model.kstep.heldout_error`), on a model of its own: the training
        model, its optimizer and its EMA target are untouched.

        Raises:
            ArchitectureMismatch: ``global_params`` does not match the world model.
        """
        if self._scorer is None:
            self._scorer = build_model(self.config, self.data.spec)
        specs = dict(self._scorer.named_parameters())
        check_architecture(global_params, specs, "global parameters")
        return heldout_error(
            self._scorer, global_params, self.data.holdout, self.config.evaluation.k_steps
        )

    def inner_state(self) -> Params:
        """AdamW moments and step counts, and the EMA target encoder, as named tensors.

        Returns:
            ``optimizer.exp_avg.<param>``, ``optimizer.exp_avg_sq.<param>`` and
            ``optimizer.step.<param>`` (float32 scalar) for every parameter once a round has
            run, ``ema.<encoder param>`` when the EMA target exists, and ``privacy.spend``
            (float64 ``[k, 3]``: ``(sigma, q, steps)`` per stretch of DP-SGD steps) under
            differential privacy; empty before the first round.
        """
        out: Params = {}
        params = dict(self.model.named_parameters())
        for name in self._names:
            state = self.optimizer.state.get(params[name], {})
            for key in _MOMENTS:
                if key in state:
                    out[f"optimizer.{key}.{name}"] = state[key].detach().clone()
        if self._target is not None:
            for name, p in self._target.encoder.named_parameters():
                out[f"ema.encoder.{name}"] = p.detach().clone()
        if self.budget is not None:
            out[PRIVACY_SPEND] = torch.tensor(self.budget.segments(), dtype=torch.float64)
        return out

    def load_inner_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Restore what :meth:`inner_state` returned (on resume or rejoin).

        Raises:
            IntegrityError: Names or shapes do not belong to this model's inner state.
        """
        params = dict(self.model.named_parameters())
        encoder = dict(self.model.encoder.named_parameters())
        check_inner_state(state, params, self.participant_id, encoder=encoder)
        self.optimizer.state.clear()
        for name, p in params.items():
            if f"optimizer.step.{name}" in state:
                self.optimizer.state[p] = {
                    key: state[f"optimizer.{key}.{name}"]
                    .detach()
                    .clone()
                    .to(torch.float32 if key == "step" else p.dtype)
                    for key in _MOMENTS
                }
        if any(key.startswith("ema.") for key in state):
            self._target = build_model(self.config, self.data.spec)
            with torch.no_grad():
                for n, p in self._target.encoder.named_parameters():
                    p.copy_(state[f"ema.encoder.{n}"])
        else:
            self._target = None
        if self.budget is not None and PRIVACY_SPEND in state:
            rows = state[PRIVACY_SPEND].reshape(-1, 3).tolist()
            self.budget.restore([(float(s), float(q), int(n)) for s, q, n in rows])

    # ---------------------------------------------------------------------------- helpers
    def _sample(self, generator: torch.Generator, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch`` random windows: obs ``[B, W+1, obs_dim]``, actions ``[B, W, action_dim]``."""
        return sample_windows(self._obs, self._actions, self.config.data.window, generator, batch)

    @torch.no_grad()
    def _update_ema(self, decay: float) -> None:
        """``target = decay * target + (1 - decay) * online``, on the encoder."""
        assert self._target is not None
        for t, p in zip(
            self._target.encoder.parameters(), self.model.encoder.parameters(), strict=True
        ):
            t.mul_(decay).add_(p.detach(), alpha=1.0 - decay)


def sample_windows(
    obs: torch.Tensor,
    actions: torch.Tensor,
    window: int,
    generator: torch.Generator,
    batch: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` random windows of ``window`` steps, drawn with ``generator``.

    Args:
        obs: ``[episodes, steps + 1, obs_dim]`` observations.
        actions: ``[episodes, steps, action_dim]`` actions.
        window: Steps per window ``W`` (count).
        generator: Source of the episode and start indices (two draws of ``batch`` each).
        batch: Windows to draw ``B`` (count).

    Returns:
        obs ``[B, W+1, obs_dim]`` and actions ``[B, W, action_dim]``.
    """
    episodes = torch.randint(obs.shape[0], (batch,), generator=generator)
    starts = torch.randint(actions.shape[1] - window + 1, (batch,), generator=generator)
    steps = starts[:, None] + torch.arange(window + 1)[None, :]
    return obs[episodes[:, None], steps], actions[episodes[:, None], steps[:, :-1]]


def build_learner(config: LensembleConfig, participant_id: str) -> WorldModelLearner:
    """The participant's learner, with its data read from its cache or collected.

    Raises:
        KeyError: No participant has that id.
        ConfigError: The environment or a physics override is unusable.
    """
    from lensemble.data.trajectories import load_or_collect

    return WorldModelLearner(config, participant_id, load_or_collect(config, participant_id))


def initial_global_parameters(config: LensembleConfig) -> Params:
    """theta_0: the deterministic initial global model (see :func:`initial_parameters`)."""
    from lensemble.data.envs import env_spec

    return initial_parameters(config, env_spec(config.data.env_id))


class SoloRun:
    """One learner training alone round after round, incrementally: no federation.

    :meth:`train_until` continues from the rounds already trained, so evaluating the run every
    few rounds costs no more than training it once; the optimizer state is carried throughout.

    Args:
        learner: The learner (its id seeds its batches, round by round).
        params: The parameters it starts from.
        steps: Inner steps per round.
    """

    def __init__(self, learner: WorldModelLearner, params: Params, steps: int) -> None:
        self.learner = learner
        self.params: Params = params
        self.steps = steps
        self.rounds = 0

    def train_until(self, rounds: int) -> Params:
        """Train the rounds not trained yet, up to ``rounds`` in all; return the parameters."""
        for round_index in range(self.rounds, rounds):
            self.params = self.learner.train_round(self.params, round_index, self.steps).params
        self.rounds = max(self.rounds, rounds)
        return self.params


class LocalOnlyRun(SoloRun):
    """The local-only baseline of one participant: it trains alone, no federation.

    Same initial parameters as the federated run and the same inner steps per round, drawn round
    by round from the same batch seeds (:class:`SoloRun`).

    Args:
        config: The run's config.
        participant_id: The participant (seeds its batches).
        data: Its private data.
        steps: Inner steps per round (``federation.inner_steps`` in a run).
    """

    def __init__(
        self, config: LensembleConfig, participant_id: str, data: ParticipantData, steps: int
    ) -> None:
        learner = WorldModelLearner(config, participant_id, data)
        super().__init__(learner, initial_parameters(config, data.spec), steps)


def train_local_only(
    config: LensembleConfig,
    participant_id: str,
    data: ParticipantData,
    rounds: int,
    steps: int,
) -> Params:
    """The local-only baseline after ``rounds`` rounds of ``steps`` inner steps.

    See :class:`LocalOnlyRun`.

    Returns:
        The participant's parameters after ``rounds * steps`` AdamW steps.
    """
    return LocalOnlyRun(config, participant_id, data, steps).train_until(rounds)
