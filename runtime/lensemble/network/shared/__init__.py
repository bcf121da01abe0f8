"""What both sides of the network transport share: nothing here imports either side.

The generated gRPC code (``proto/``), the wire framing of payload streams, payload limits, the
transport's error vocabulary, peer text made safe to log, process identity, TLS material and
tokens, certificates, logs, metrics, the health service and the ready line.
"""
