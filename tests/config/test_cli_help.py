"""Issue 41, item 10: every command's help reads as plain text at 80 columns.

Before the fix: ``lensemble simulate --help`` showed ``[[CONFIG]]``, flags and examples were
split across lines (``--ca-`` / ``bundle``, a ``--faults`` example cut mid-entry), docstrings
showed raw reStructuredText (````{"status": ...}````), and ``--faults`` named 4 of its 7 kinds.
"""

from __future__ import annotations

import re

import pytest
import typer

from lensemble.federation.fault_kinds import ALIASES, FAULT_KINDS
from lensemble.federation.faults import parse_faults
from tests.support.cli import run_cli

#: reStructuredText that must not reach a person: inline literals and Sphinx roles.
RAW_MARKUP = re.compile(r"``|:(func|mod|class|data|meth|attr):`")
#: A word cut at a hyphen or mid-word at a line end ("--ca-" then "bundle").
SPLIT_WORD = re.compile(r"[A-Za-z0-9]-\n")


def _command_paths() -> list[tuple[str, ...]]:
    from lensemble.cli import app

    paths: list[tuple[str, ...]] = []

    def walk(command: object, path: tuple[str, ...]) -> None:
        if getattr(command, "hidden", False):
            return
        paths.append(path)
        for name, sub in (getattr(command, "commands", None) or {}).items():
            walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return paths


@pytest.fixture
def columns_80(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")


@pytest.mark.parametrize("path", _command_paths(), ids=lambda p: " ".join(p) or "lensemble")
def test_help_is_plain_text_that_keeps_words_whole(path: tuple[str, ...], columns_80: None) -> None:
    result = run_cli(*path, "--help")
    assert result.code == 0, result.err
    text = result.out
    assert "[[" not in text, text
    assert not RAW_MARKUP.search(text), RAW_MARKUP.search(text)
    split = SPLIT_WORD.search(text)
    assert split is None, text[max(0, split.start() - 60) : split.end() + 20]


def test_faults_help_lists_every_kind_the_parser_accepts(columns_80: None) -> None:
    text = " ".join(run_cli("simulate", "--help").out.split())  # unwrapped
    for kind in FAULT_KINDS:
        assert kind.example in text, kind.name
        plan = parse_faults(kind.example, ["alpine", "coastal", "delta"])
        assert [fault.kind for fault in plan.faults] == [kind.name]
    # Every name the parser takes is a listed kind or an alias of one.
    assert set(ALIASES.values()) <= {kind.name for kind in FAULT_KINDS}
