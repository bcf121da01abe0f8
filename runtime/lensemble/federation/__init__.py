"""The DiLoCo core: rounds, coordinator, participant, DiLoCo, payloads, ledger, transports.

Importing it imports torch. It never imports data, models or evaluation: a participant trains
through the :class:`lensemble.learner.Learner` seam, and running a whole federation on one
machine is :mod:`lensemble.simulation`. The coordinator, participant and round state machine
never know which transport carries them (see :mod:`lensemble.federation.transport`).
"""
