"""The huge-page switch: on by default for the CLI, and an operator's choice wins."""

from __future__ import annotations

import pytest

from lensemble.machinery import hugepages
from lensemble.machinery.hugepages import HUGEPAGE_ENV, enable_for_this_process


def test_torch_allocator_switch_is_set_when_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    enable_for_this_process()
    assert hugepages.os.environ["THP_MEM_ALLOC_ENABLE"] == HUGEPAGE_ENV["THP_MEM_ALLOC_ENABLE"]


def test_an_operator_who_turned_it_off_keeps_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "0")
    enable_for_this_process()
    assert hugepages.os.environ["THP_MEM_ALLOC_ENABLE"] == "0"
