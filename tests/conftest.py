"""Shared fixtures: the repository root and a working directory per test."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def repo() -> Path:
    """The repository root."""
    return REPO


@pytest.fixture
def in_repo(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run the test with the repository root as working directory."""
    monkeypatch.chdir(REPO)
    return REPO
