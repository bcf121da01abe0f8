"""The coordinator side of the network transport: the gRPC service and what stands behind it.

It never imports the participant side (``lensemble.network.participant``); what both sides
share is in ``lensemble.network.shared``.
"""
