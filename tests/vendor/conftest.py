"""Fixtures of the vendoring tests (defined in :mod:`tests.vendor.fixtures`)."""

from tests.vendor.fixtures import demo, index, pinned

__all__ = ["demo", "index", "pinned"]
