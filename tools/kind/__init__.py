"""The local overlay on a kind cluster, end to end (``python -m tools.kind up|down``)."""
