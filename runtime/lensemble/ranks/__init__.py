"""A participant as a group of ranks: its inner loop sharded with FSDP2 under torch's launcher.

When a participant's rank layout (``LensembleConfig.rank_layout``) has more than one rank,
:func:`lensemble.ranks.learner.learner_for` gives it a
:class:`~lensemble.ranks.learner.RankGroupLearner`: each round it starts the participant's
ranks with ``torch.distributed.launcher.api.elastic_launch`` (the library behind torchrun),
which run :func:`lensemble.ranks.worker.rank_main`. One rank layout of one rank keeps the
single-process :class:`~lensemble.model.inner_loop.WorldModelLearner` (same hash chain as ever).
"""
