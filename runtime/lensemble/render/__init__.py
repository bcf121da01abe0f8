"""Renderers: deployment artifacts generated from one LensembleConfig."""
