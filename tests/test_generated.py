"""Every committed generated file is exactly what its generator writes today.

One test over the registry of ``tools/regenerate.py``; a stale file names the one command that
rewrites every generated file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.tools import require
from tools import regenerate

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("entry", regenerate.REGISTRY, ids=lambda e: e.path)
def test_committed_generated_file_is_fresh(entry: Any) -> None:
    for tool in entry.tools:
        require(tool)
    committed = (REPO / entry.path).read_text(encoding="utf-8")
    assert committed == entry.generate(REPO), f"{entry.path} is stale; run: {regenerate.COMMAND}"


def test_registry_lists_each_file_once_and_every_file_exists() -> None:
    paths = [entry.path for entry in regenerate.REGISTRY]
    assert len(paths) == len(set(paths))
    assert all((REPO / path).is_file() for path in paths)


def test_check_mode_reports_a_stale_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--check`` exits 1 and names the file when one is stale, and writes nothing."""
    (tmp_path / "config").mkdir()
    stale = tmp_path / "config/lensemble.schema.json"
    stale.write_text("{}\n", encoding="utf-8")
    entry = regenerate.REGISTRY[0]
    assert entry.path == "config/lensemble.schema.json"
    monkeypatch.setattr(regenerate, "REGISTRY", (entry,))
    monkeypatch.setattr(regenerate, "ROOT", tmp_path)
    assert regenerate.main(["--check"]) == 1
    assert stale.read_text(encoding="utf-8") == "{}\n"
    assert regenerate.main([]) == 0
    assert stale.read_text(encoding="utf-8") == entry.generate(tmp_path)
