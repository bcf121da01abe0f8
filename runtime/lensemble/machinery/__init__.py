"""Memory and I/O machinery under the runtime: no federation concept lives here.

- ``allocator``: malloc keeps the buffers a round frees (no page faults next round).
- ``hugepages``: 2 MiB pages for model-sized buffers.
- ``fresh_bytes``: payload-sized ``bytes`` built in place and recycled.
- ``flat``: named tensors as views into one buffer.
- ``hash_behind``: SHA-256 on a worker thread, beside the work that produces the bytes.
- ``determinism``: bit-identical CPU computation (single-threaded intra-op work).

``allocator`` and ``hugepages`` import only the standard library (the base install's CLI
start-up uses them); the rest need torch or numpy. Measured figures live in
docs/performance.md, not here.
"""
