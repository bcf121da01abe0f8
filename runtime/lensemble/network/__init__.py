"""The network transport: coordinator and participants as separate processes over gRPC.

Training layer 4 (see ``docs/architecture.md``): it imports the federation runtime, grpcio and
prometheus-client, and is imported only by :mod:`lensemble.cli` (inside commands) and
:mod:`lensemble.simulation` (a federation as local processes). The coordinator and
participant logic is the federation runtime's, unchanged; this package carries it over the wire
(``shared/proto/lensemble.proto``), secures it (TLS, mutual TLS or bearer tokens), and wraps it
in processes with health, metrics and a ready line.

It has two sides and what they share (``lint-imports`` holds the boundaries):

- ``shared``: the wire (generated gRPC code, chunk frames, gRPC options, payload limits, the
  model download's format), the error vocabulary, identity, TLS material and tokens,
  certificates, logs, metrics, health and the ready line. It imports neither side.
- ``coordinator``: the gRPC service and server, the call guard, the authenticator, the
  ``GrpcCoordinatorTransport`` and the model download server.
- ``participant``: the coordinator client, the round loop, retries and backoff, the model
  download client. It never imports the coordinator side, nor the federation coordinator's
  machinery.
- ``launch``: process start-up of both roles, the only part that imports both sides.
"""
