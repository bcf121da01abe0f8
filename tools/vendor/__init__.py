"""Vendored upstream code in ``third_party/``: pinned releases plus a patch series, guarded.

Each project under ``third_party/<name>/`` has a human-edited manifest (``vendor.toml``), a
machine-written lock (``vendor.lock.json``) and a patch series (``patches/NNNN-*.patch`` with
DEP-3 headers). :func:`sync_project` materialises ``third_party/<name>/src/`` as the pinned
distribution, byte-identical to upstream, with the patches applied; :func:`check_project` is
the drift and license guard (RFC-0016 §2). This layer imports only the standard library,
pydantic, ``packaging`` and ``lensemble.errors``; it never imports torch or the vendored code.
"""

from tools.vendor.drift import CheckReport, check_project
from tools.vendor.manifest import Project, find_projects, load_project
from tools.vendor.sync import SyncReport, sync_project

__all__ = [
    "CheckReport",
    "Project",
    "SyncReport",
    "check_project",
    "find_projects",
    "load_project",
    "sync_project",
]
