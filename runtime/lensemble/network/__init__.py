"""The network transport: coordinator and participants as separate processes over gRPC.

Layer 4 (see ``docs/architecture.md``): it imports the federation runtime, grpcio and
prometheus-client, and is imported only by CLI commands that run a process. The coordinator and
participant logic is the federation runtime's, unchanged; this package carries it over the wire
(``proto/lensemble.proto``), secures it (TLS, mutual TLS or bearer tokens), and wraps it in
processes with health, metrics and a ready line.
"""
