"""Secure aggregation by masking (Bonawitz et al., CCS'17, with the malicious-server extensions).

The coordinator learns only the sum of the survivors' fixed-point updates: each participant adds
a self mask and pairwise masks that cancel in the sum, and the coordinator removes what is left
with Shamir shares that the survivors reveal. This package is the protocol core, free of any
transport: :class:`~lensemble.federation.secagg.participant.ParticipantSession` and
:class:`~lensemble.federation.secagg.server.ServerSession` exchange only the typed messages of
:mod:`~lensemble.federation.secagg.messages`, each step a deterministic function of its inputs
and of secrets derived from a participant-held seed. :mod:`~lensemble.federation.secagg.local`
runs a whole session in one process (tests, bench); the coordinator and transports wire it in
phase 2 (issue 37). What it guarantees: ``docs/security.md``, "Secure aggregation (masking)".
"""
