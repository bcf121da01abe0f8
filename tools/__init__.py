"""Development tools of the source checkout, run from the repository root (``python -m tools.X``).

Nothing here is installed with the ``lensemble`` package or shipped in the runtime image; the
runtime never imports it (an import-linter contract in pyproject.toml checks that).
"""
