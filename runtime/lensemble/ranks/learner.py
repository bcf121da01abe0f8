"""The Learner of a participant with several ranks: one elastic launch of its group per round.

Why a group per round rather than one persistent group fed between rounds: a round is the unit
that succeeds or fails (a dead rank loses exactly that round's update), the launcher's restart
is then the start of the next round's group, and the participant process keeps a single thread
with no long-lived children to supervise across coordinator restarts, SIGTERM and resume. The
price is the start-up of the ranks each round: the ranks are forked from a server that imported
torch and the rank code once (``ranks.launch.START_METHOD``, started with the learner), then
rendezvous, ``init_process_group``, and the state broadcast and gather (figures:
docs/performance.md#rank-groups-in-process).

The inner optimizer state stays with the participant between rounds as full tensors in the
same names as :class:`lensemble.model.inner_loop.WorldModelLearner`'s, so checkpoints, resume
and rejoin work unchanged (and a participant may change its rank count between runs).
"""

from __future__ import annotations

import shutil
import tempfile
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file

from lensemble.errors import RankFailure, RankGroupExhausted
from lensemble.learner import Learner, LocalRound, Params
from lensemble.model.inner_loop import check_inner_state
from lensemble.model.kstep import heldout_error
from lensemble.model.worldmodel import build_model, check_architecture
from lensemble.ranks.exchange import FAILED, GLOBAL, INNER, INNER_OUT, LOCAL, RoundJob, RoundResult
from lensemble.ranks.launch import LaunchBoard, launch_round, new_run_id, start_fork_server

if TYPE_CHECKING:
    from lensemble.config.schema import LensembleConfig
    from lensemble.data.trajectories import ParticipantData


class RankGroupLearner:
    """A participant's inner loop run by its rank group (FSDP2, one launch per round).

    Args:
        config: The run's config (``rank_layout(participant_id)`` has more than one rank).
        participant_id: The participant.
        data: Its private data (the ranks read the same site cache).

    Attributes:
        failures: Rounds lost to a dead rank so far (count).
        launch_seconds: Wall time of the last launch, start-up included (seconds).
        main_thread_only: True: torch's elastic launcher installs its signal handlers only on
            the main thread (without them a stopped run could orphan its ranks), so the
            simulation never trains this learner on a worker thread.
    """

    main_thread_only = True

    def __init__(self, config: LensembleConfig, participant_id: str, data: ParticipantData) -> None:
        self.config = config
        self.participant_id = participant_id
        self.layout = config.rank_layout(participant_id)
        model = build_model(config, data.spec)
        self._specs = {n: p.detach() for n, p in model.named_parameters()}
        self._scorer = model  # scores received models in this process (heldout_loss)
        self._holdout = data.holdout
        self._inner: Params = {}
        self._kill_next = -1
        self._board: LaunchBoard | None = None  # node 0 of several: names each launch's id
        self.failures = 0
        self.launch_seconds = 0.0
        self._root = Path(tempfile.mkdtemp(prefix=f"lensemble-ranks-{participant_id}-"))
        start_fork_server()  # its imports run while the participant joins, collects, waits
        # The folder goes with the learner even when nobody calls close (the simulation).
        weakref.finalize(self, shutil.rmtree, self._root, ignore_errors=True)

    def heldout_loss(self, global_params: Mapping[str, torch.Tensor]) -> float | None:
        """The k-step error of ``global_params`` on this site's held-out data, in this process.

        The same score as the single-process learner's
        (:meth:`lensemble.model.inner_loop.WorldModelLearner.heldout_loss`): scoring needs no
        rank group.

        Raises:
            ArchitectureMismatch: ``global_params`` does not match the world model.
        """
        check_architecture(global_params, self._specs, "global parameters")
        return heldout_error(
            self._scorer, global_params, self._holdout, self.config.evaluation.k_steps
        )

    def arm_rank_kill(self, rank: int) -> None:
        """Make ``rank`` kill itself after its first inner step of the next round (a fault)."""
        self._kill_next = rank

    def train_round(
        self, global_params: Mapping[str, torch.Tensor], round_index: int, steps: int
    ) -> LocalRound:
        """Train one round on the rank group; see :class:`lensemble.learner.Learner`.

        Raises:
            ArchitectureMismatch: ``global_params`` does not match the world model.
            RankFailure: A rank died: this round's update is lost (the group restarts next
                round).
            RankGroupExhausted: More rounds lost than the layout's ``max_restarts``.
        """
        check_architecture(global_params, self._specs, "global parameters")
        folder = self._root / f"round-{round_index}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(mode=0o700)
        save_file({n: t.detach().contiguous() for n, t in global_params.items()}, folder / GLOBAL)
        if self._inner:
            save_file(self._inner, folder / INNER)
        kill, self._kill_next = self._kill_next, -1
        RoundJob(
            self.config.model_dump_json(), self.participant_id, round_index, steps, kill
        ).write(folder)
        start = time.perf_counter()
        from torch.distributed.elastic.rendezvous.api import RendezvousError

        try:
            try:
                deaths = launch_round(
                    self.layout, folder, self._run_id(), self.config.federation.join_timeout_s
                )
            except RendezvousError as exc:  # a node left the group or never came
                raise RankFailure(
                    f"the nodes of participant '{self.participant_id}' did not meet for round "
                    f"{round_index} ({type(exc).__name__}); its update for that round is lost;",
                    remediation="check that every node's participant process is running; the "
                    "group meets again for the next round.",
                ) from None
            if (folder / FAILED).exists():
                how = f" ({'; '.join(deaths)})" if deaths else ""
                raise RankFailure(
                    f"a rank of participant '{self.participant_id}' died in round "
                    f"{round_index}{how}; its update for that round is lost;",
                    remediation="the group starts again for the next round.",
                )
            result = RoundResult.read(folder)
            params = load_file(folder / LOCAL)
            self._inner = load_file(folder / INNER_OUT)
        except RankFailure:
            self.failures += 1
            if self.failures > self.layout.max_restarts:
                raise RankGroupExhausted(
                    f"participant '{self.participant_id}' lost {self.failures} "
                    f"{'round' if self.failures == 1 else 'rounds'} to dead "
                    f"ranks, more than max_restarts={self.layout.max_restarts};",
                    remediation="look at the ranks' errors, then raise max_restarts of its "
                    "rank layout or fix the node.",
                ) from None
            raise
        finally:
            self.launch_seconds = time.perf_counter() - start
            shutil.rmtree(folder, ignore_errors=True)
        return LocalRound(params, result.mean_loss, result.compute_seconds)

    def _run_id(self) -> str:
        """A new rendezvous id for the next launch, named on the board when other nodes follow."""
        if self.layout.nodes == 1:
            return new_run_id(self.participant_id)
        if self._board is None:
            self._board = LaunchBoard.host(self.layout)
        return self._board.announce(self.participant_id)

    def inner_state(self) -> Params:
        """AdamW moments and step counts by parameter, as the single-process learner names them."""
        return {k: v.clone() for k, v in self._inner.items()}

    def load_inner_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Restore :meth:`inner_state` (an empty mapping resets to no optimizer history).

        Raises:
            IntegrityError: Names or shapes do not belong to this model's inner state.
        """
        check_inner_state(state, self._specs, self.participant_id)
        self._inner = {k: v.detach().clone().float().contiguous() for k, v in state.items()}

    def close(self) -> None:
        """End the group on the other nodes (when there are any) and remove the round folders."""
        try:
            if self.layout.nodes > 1:
                folder = self._root / "stop"
                folder.mkdir(mode=0o700, exist_ok=True)
                job = RoundJob(self.config.model_dump_json(), self.participant_id, -1, 0, stop=True)
                job.write(folder)
                launch_round(
                    self.layout, folder, self._run_id(), self.config.federation.join_timeout_s
                )
        finally:
            self._board = None
            shutil.rmtree(self._root, ignore_errors=True)


def learner_for(
    config: LensembleConfig,
    participant_id: str,
    data: ParticipantData,
    *,
    noise_seed: int | None = None,
) -> Learner:
    """The participant's learner: single-process for one rank, a rank group otherwise.

    A single-process learner applies the participant's own ``privacy`` section
    (``federation.participants[i].privacy``); the config's rules keep it to one rank. Its
    DP-SGD randomness comes from ``noise_seed``, the participant's secret (None: derived from
    the run seed, as the in-process simulation does).
    """
    if config.rank_layout(participant_id).world_size > 1:
        return RankGroupLearner(config, participant_id, data)
    from lensemble.model.inner_loop import WorldModelLearner

    # The participant's own privacy section: nothing the coordinator sends sets it.
    privacy = config.participant(participant_id).privacy
    return WorldModelLearner(config, participant_id, data, privacy=privacy, noise_seed=noise_seed)


def build_learner(
    config: LensembleConfig, participant_id: str, *, noise_seed: int | None = None
) -> Learner:
    """The participant's learner (:func:`learner_for`), its data read from its cache or collected.

    Raises:
        KeyError: No participant has that id.
        ConfigError: The environment or a physics override is unusable.
    """
    from lensemble.data.trajectories import load_or_collect

    data = load_or_collect(config, participant_id)
    return learner_for(config, participant_id, data, noise_seed=noise_seed)
