"""Fixtures of the Kubernetes tests."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def _cache_kubernetes_schemas() -> Iterator[None]:
    """kubernetes-validate re-reads its 1.8 MB definitions file on every call; read it once.

    The schemas are read-only data, so sharing them across calls changes nothing but the time.
    """
    if importlib.util.find_spec("kubernetes_validate") is None:
        yield
        return
    import kubernetes_validate.utils as kv_utils

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kv_utils, "schema_contents", functools.cache(kv_utils.schema_contents))
        yield
