"""Digests of a vendored tree: one SHA-256 per file and one digest over the whole tree.

Byte caches that Python writes when the shim imports the tree (``__pycache__/``, ``*.pyc``) are
not part of the tree; empty directories carry no bytes and are ignored too.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

DIGEST_PREFIX = "sha256-tree-v1:"
_IGNORED_DIRS = frozenset({"__pycache__"})
_IGNORED_SUFFIXES = (".pyc", ".pyo")


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def file_digests(root: Path) -> dict[str, str]:
    """SHA-256 of every file under ``root``, keyed by POSIX path relative to ``root``, sorted.

    A symbolic link is recorded by its target (``symlink:<target>`` hashed), never followed.
    """
    found: dict[str, str] = {}
    for current, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = [d for d in dirs if d not in _IGNORED_DIRS]
        for name in files:
            if name.endswith(_IGNORED_SUFFIXES):
                continue
            path = Path(current, name)
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                target = f"symlink:{os.readlink(path)}".encode()
                found[rel] = hashlib.sha256(target).hexdigest()
            else:
                found[rel] = sha256_file(path)
    return dict(sorted(found.items()))


def tree_digest(files: dict[str, str]) -> str:
    """``sha256-tree-v1:<hex>``: SHA-256 over one ``<sha256>  <path>`` line per file, by path.

    Each line has the format ``sha256sum`` prints, so the digest is easy to reproduce by hand.
    """
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(f"{files[path]}  {path}\n".encode())
    return DIGEST_PREFIX + digest.hexdigest()


@dataclass(frozen=True)
class TreeDiff:
    """How a tree differs from the expected file map.

    Attributes:
        modified: Paths whose SHA-256 differs, sorted.
        added: Paths present but not expected, sorted.
        removed: Paths expected but absent, sorted.
    """

    modified: list[str]
    added: list[str]
    removed: list[str]

    @property
    def clean(self) -> bool:
        """True when nothing differs."""
        return not (self.modified or self.added or self.removed)

    def first(self, count: int = 5) -> list[str]:
        """The first ``count`` differing paths, each tagged with how it differs."""
        tagged = sorted(
            [(p, "modified") for p in self.modified]
            + [(p, "added") for p in self.added]
            + [(p, "removed") for p in self.removed]
        )
        return [f"{path} ({how})" for path, how in tagged[:count]]


def diff_trees(expected: dict[str, str], actual: dict[str, str]) -> TreeDiff:
    """Compare two file maps (path to SHA-256)."""
    return TreeDiff(
        modified=sorted(p for p in expected.keys() & actual.keys() if expected[p] != actual[p]),
        added=sorted(actual.keys() - expected.keys()),
        removed=sorted(expected.keys() - actual.keys()),
    )
