"""The participant side of the network transport: the client of the coordinator's service.

It never imports the coordinator side (``lensemble.network.coordinator``), nor the federation
coordinator's machinery (``lensemble.federation.coordinator``, ``lensemble.federation.spool``);
what both sides share is in ``lensemble.network.shared``.
"""
