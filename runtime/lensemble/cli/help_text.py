"""Help text that wraps between words only: flags, paths and examples stay whole.

Click wraps help with :class:`textwrap.TextWrapper`'s defaults, which break a word at a hyphen
and cut a word longer than the line: ``--ca-bundle`` became ``--ca-`` and ``bundle`` on the
next line, and a ``--faults`` example was cut mid-entry, so neither could be copied from the
help. :func:`keep_words_whole` makes the wrapper break at spaces only (a word longer than the
line overflows it instead). Typer carries its own copy of Click (``typer._click``), which is
the one that formats Lensemble's help; a plain Click is patched too where it is installed.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

#: The Click wrapper modules help text goes through (``wrap_text`` looks the class up per call).
WRAPPER_MODULES = ("typer._click._textwrap", "click._textwrap")


def keep_words_whole() -> None:
    """Make Click's help wrapper break at spaces only; idempotent."""
    for name in WRAPPER_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        _patch(module)


def _patch(module: ModuleType) -> None:
    base = module.TextWrapper
    if getattr(base, "keeps_words_whole", False):
        return

    class WholeWords(base):  # type: ignore[misc, valid-type]
        """Click's wrapper without breaks at hyphens or inside long words."""

        keeps_words_whole = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("break_on_hyphens", False)
            kwargs.setdefault("break_long_words", False)
            super().__init__(*args, **kwargs)

    module.TextWrapper = WholeWords  # type: ignore[attr-defined]
