"""Outbound-connection audit for child processes (put this folder on PYTHONPATH).

When ``LENSEMBLE_AUDIT_FILE`` is set, every Python-level ``socket.connect`` and name lookup, and
the target of every gRPC channel (gRPC connects from C, below Python's audit events), is appended
to that file as one JSON line with the process id. Tests then assert that nothing but the
configured coordinator was ever contacted.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
from typing import Any

_PATH = os.environ.get("LENSEMBLE_AUDIT_FILE")


def _record(kind: str, target: Any) -> None:
    assert _PATH is not None
    line = json.dumps({"pid": os.getpid(), "kind": kind, "target": repr(target)})
    with open(_PATH, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event == "socket.connect":
        _record("connect", args[1])
    elif event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr"):
        _record("lookup", args[0])


def _wrap_channels(grpc: Any) -> None:
    for name in ("secure_channel", "insecure_channel"):
        original = getattr(grpc, name)

        def wrapped(target: str, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            _record("grpc_channel", target)
            return _original(target, *args, **kwargs)

        setattr(grpc, name, wrapped)


class _GrpcFinder(importlib.abc.MetaPathFinder):
    """Patches ``grpc`` right after it is imported."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "grpc":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module: Any) -> None:
            original_exec(module)
            _wrap_channels(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if _PATH:
    sys.addaudithook(_hook)
    sys.meta_path.insert(0, _GrpcFinder())
