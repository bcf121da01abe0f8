"""What a run on one machine does with each committed round: its metrics line and scores.

:class:`RoundScoring` is the hook :meth:`lensemble.federation.coordinator.Coordinator.run` calls
after each commit (``after_commit``): it builds the round's :class:`RoundMetrics` line, scores
the global model next to its baselines every ``evaluation.every_rounds`` rounds and after the
last one (:mod:`lensemble.simulation.evaluation`), and appends the line to ``metrics.jsonl``.
:func:`rebuild_metrics` builds, on resume, the line of a committed round a crash lost, scored as
the lost line was.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from lensemble.federation.checkpoint import CheckpointStore
from lensemble.simulation.output import append_metrics
from lensemble.simulation.summary import RoundMetrics

if TYPE_CHECKING:
    from lensemble.config import LensembleConfig
    from lensemble.federation.coordinator import Coordinator
    from lensemble.federation.ledger import RoundRecord
    from lensemble.simulation.evaluation import Evaluation


def evaluated(config: LensembleConfig, round_index: int) -> bool:
    """Whether the metrics line of ``round_index`` carries held-out scores."""
    last = round_index + 1 == config.federation.rounds
    return last or (round_index + 1) % config.evaluation.every_rounds == 0


class RoundScoring:
    """The metrics line of each committed round, scored on evaluated rounds and appended.

    Args:
        config: The run's config (``evaluation``, ``federation.rounds``).
        out: The run folder (``metrics.jsonl``).
        evaluation: Scores the global model and its baselines.
        coordinator: The coordinator whose rounds are scored (its ``params`` and ``version``
            are read when :meth:`committed` is called).
        on_metrics: Called with each round's line once it is written.

    Attributes:
        metrics: Every line written by this process, in round order.
        scored: The last line carrying scores, or None.
    """

    def __init__(
        self,
        config: LensembleConfig,
        out: Path,
        evaluation: Evaluation,
        coordinator: Coordinator,
        on_metrics: Callable[[RoundMetrics], None] | None = None,
    ) -> None:
        self.config, self.out, self.evaluation = config, out, evaluation
        self.coordinator = coordinator
        self.on_metrics = on_metrics
        self.metrics: list[RoundMetrics] = []
        self.scored: RoundMetrics | None = None

    def committed(self, record: RoundRecord) -> None:
        """Score and write ``record``'s line; the coordinator holds that round's model now."""
        line = RoundMetrics.of(record)
        if evaluated(self.config, record.round):
            self.evaluation.score(line, self.coordinator.params, self.coordinator.version)
            self.scored = line
        append_metrics(self.out, line)
        self.metrics.append(line)
        if self.on_metrics is not None:
            self.on_metrics(line)

    def final(self) -> RoundMetrics:
        """The line holding the final model's scores (scored now on a resumed finished run)."""
        if self.scored is None:
            coordinator = self.coordinator
            self.scored = RoundMetrics(
                coordinator.version - 1, coordinator.model_hash, [], None, 0, 0, 0, 0
            )
            self.evaluation.score(self.scored, coordinator.params, coordinator.version)
        return self.scored


def rebuild_metrics(
    config: LensembleConfig, out: Path, evaluation: Evaluation, record: RoundRecord
) -> RoundMetrics:
    """The metrics line of a committed round a crash lost, scored as the lost line was.

    An evaluated round gets every field a line written at the time has: the global model's
    scores from its checkpoint, and every enabled baseline's (local-only, pooled oracle,
    FedAvg), trained again up to that round from the config and seed, which gives the same
    values. Should the round's checkpoint be gone (pruned; a crash loses only the newest
    round's line, whose checkpoint is kept), the global model cannot be scored again: the line
    then says why in ``unscored`` and the report leaves a gap there.

    Args:
        config: The run's config (``evaluation``, ``federation.rounds``).
        out: The run folder (its checkpoints).
        evaluation: The run's evaluation; its baselines train on up to the round (rounds
            already trained are not repeated), so call this in round order.
        record: The committed round's ledger record.

    Returns:
        The line: the record's lineage, and on an evaluated round its scores.

    Raises:
        IntegrityError: The round's checkpoint is corrupt (the resume verified it just before).
    """
    line = RoundMetrics.of(record)
    if not evaluated(config, record.round):
        return line
    version = record.round + 1
    store = CheckpointStore(out)
    if version in store.versions():
        ckpt = store.load(version)
        assert ckpt is not None
        evaluation.score(line, ckpt.params, version)
    else:
        evaluation.score_baselines(line, version)
        line.unscored = (
            f"rebuilt on resume after checkpoint v{version} was pruned: the global model of "
            f"round {record.round} could not be scored again"
        )
    return line
