"""The federation runtime: rounds, coordinator, participant, DiLoCo, payloads, transports.

Importing it imports torch. The coordinator, participant and round state machine never know
which transport carries them (see :mod:`lensemble.federation.transport`).
"""
