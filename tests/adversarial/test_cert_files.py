"""``certs init`` in a hostile folder: planted symbolic links never receive key material.

On main, ``certs init`` wrote every file through the fixed name ``.<file>.tmp`` and followed a
symbolic link planted there, so the CA's private key landed in a file of the attacker's choosing.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from lensemble.config.load import validate_mapping
from lensemble.durable import DiskFull
from lensemble.errors import UsageError
from lensemble.network.shared import certs
from lensemble.network.shared.certs import init_certs

CONFIG = validate_mapping({"federation": {"participants": [{"id": "alpha"}, {"id": "bravo"}]}})


def _plant(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)


def test_planted_links_at_the_old_temporary_names_receive_nothing(tmp_path: Path) -> None:
    root, loot = tmp_path / "certs", tmp_path / "attacker"
    loot.mkdir()
    planted = {}
    for name in ("ca.key", "ca.crt"):
        planted[name] = loot / name
        _plant(root / f".{name}.tmp", planted[name])
    for identity in ("coordinator", "alpha"):
        for name in ("tls.key", "tls.crt", "ca.crt"):
            planted[f"{identity}/{name}"] = loot / f"{identity}-{name}"
            _plant(root / identity / f".{name}.tmp", planted[f"{identity}/{name}"])
    init_certs(root, CONFIG)
    assert not any(target.exists() for target in planted.values())
    assert not list(loot.iterdir()), "key material leaked through a planted link"
    key = root / "ca.key"
    assert stat.S_ISREG(os.lstat(key).st_mode)
    assert key.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")


def test_a_link_planted_as_the_key_itself_is_replaced_not_written_through(
    tmp_path: Path,
) -> None:
    root, victim = tmp_path / "certs", tmp_path / "victim.txt"
    victim.write_text("untouched", encoding="utf-8")
    _plant(root / "ca.key", victim)  # no ca.crt: a new CA is made and written over the link
    _plant(root / "alpha" / "tls.key", victim)
    init_certs(root, CONFIG)
    assert victim.read_text(encoding="utf-8") == "untouched"
    for key in (root / "ca.key", root / "alpha" / "tls.key"):
        info = os.lstat(key)
        assert stat.S_ISREG(info.st_mode) and info.st_mode & 0o777 == 0o600


def test_an_identity_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "certs", tmp_path / "elsewhere"
    elsewhere.mkdir()
    _plant(root / "coordinator", elsewhere)
    _plant(root / "bravo", elsewhere)
    with pytest.raises(UsageError, match="coordinator is a symbolic link or not a folder"):
        init_certs(root, CONFIG)
    assert not list(elsewhere.iterdir())
    # Nothing was written before the refusal: no CA, no other identity's keys.
    assert sorted(p.name for p in root.iterdir()) == ["bravo", "coordinator"]


def test_folders_are_private_and_no_temporary_file_is_left(tmp_path: Path) -> None:
    root = tmp_path / "certs"
    init_certs(root, CONFIG)
    assert root.stat().st_mode & 0o777 == 0o700
    (root / "alpha").chmod(0o755)  # loosened by hand: the next run tightens it again
    init_certs(root, CONFIG)
    for identity in ("coordinator", "alpha", "bravo"):
        folder = root / identity
        assert folder.stat().st_mode & 0o777 == 0o700
        assert sorted(p.name for p in folder.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
        assert (folder / "tls.crt").stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in root.iterdir() if p.is_file()) == ["ca.crt", "ca.key"]


def test_a_failed_write_leaves_no_temporary_file_and_no_partial_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "certs"

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(certs.os, "fsync", full_disk)
    with pytest.raises(DiskFull, match="no space left in"):
        init_certs(root, CONFIG)
    files = [p for p in root.rglob("*") if not p.is_dir()]
    assert files == [], "a temporary or partial file was left behind"
